"""autopipe: automatic pipeline-parallelism planning for PyTorch models.

``autopipe.plan(model, example_inputs, stages=4, memory="16GiB", batch_size=32)`` profiles a
model and returns its Plan, ``autopipe.profile(...)`` the Profile alone; ``autopipe.api`` has the rest of the programmatic interface.
"""

from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.errors import (
    AutopipeError,
    EmitError,
    InfeasibleError,
    ModelLoadError,
    PlanError,
    PlanFileError,
    ProfileError,
    RuntimeFailure,
    ScheduleError,
    TraceError,
)
from autopipe.plans import Plan

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # ``autopipe.plan`` and ``autopipe.profile`` are imported on first use, so ``import
    # autopipe`` (and the CLI's --help) does not wait for torch.
    if name in ("plan", "profile"):
        from autopipe import api

        return getattr(api, name)
    raise AttributeError(f"module 'autopipe' has no attribute {name!r}")


__all__ = [
    "Affine",
    "AutopipeError",
    "BlockCost",
    "EmitError",
    "InfeasibleError",
    "ModelLoadError",
    "Plan",
    "PlanError",
    "PlanFileError",
    "Profile",
    "ProfileError",
    "RuntimeFailure",
    "ScheduleError",
    "TensorCost",
    "TraceError",
    "__version__",
    "plan",
    "profile",
]
