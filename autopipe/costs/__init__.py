"""What every block costs: the Profile, and the two ways to make one.

- :mod:`.profile`: the :class:`Profile` value (plain data, no torch) the planner reasons with;
- :mod:`.measured`: the measured profiler (trace, time each block, fit), with :mod:`.timing`;
- :mod:`.analytic`: the analytic profile on the meta device, with :mod:`.counting` (FLOPs and
  bytes), :mod:`.devices` (the accelerator catalogue) and :mod:`.calibrate`.
"""

from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost

__all__ = ["Affine", "BlockCost", "Profile", "TensorCost"]
