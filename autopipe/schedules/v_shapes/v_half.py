"""V-Half, the V-shaped schedule at half of 1F1B's activation memory (Qi et al., "Pipeline
Parallelism with Controllable Memory", NeurIPS 2024, section 3), built as the authors build it.

``2S`` chunks in a V (:func:`~autopipe.schedules.action.v_shape`: device ``d`` runs chunk ``d``
and chunk ``2S-1-d``), backward split into B and W. The building block (:func:`pattern`, the
authors' ``stable_pattern_v_half``): device ``d`` runs micro-batch 0's forward down the V in
slot ``2d`` and back up in slot ``3S-2-d``, its backward of the up chunk in slot
``3S-1+2d+g`` and of the down chunk in ``6S-2-d+g`` (``g = 3`` for even ``S``, else 0, so no
two passes of a device share a slot modulo 6): forwards and backwards two slots apart on one
leg, one on the other. Repeated every 6 slots, squeezed and reordered by
:mod:`~autopipe.schedules.v_shapes.v_block`. ``S=4``, ``m=8``, every pass one unit, the first 24 slots
as the simulator times them ("-" idle)::

    device 0 | 0F0 0F1 0F2 0F3 0F4 -   -   7F0 7B0 7W0 7F1 7B1 7W1 7F2 -   -   0B0 7B2 ...
    device 1 | -   1F0 1F1 1F2 1F3 -   6F0 -   6F1 6B0 6W0 6F2 6B1 6W1 -   1B0 1W0 1F4 ...
    device 2 | -   -   2F0 2F1 2F2 5F0 -   5F1 -   5F2 5B0 5W0 2F3 5B1 2B0 5W1 2W0 5F3 ...
    device 3 | -   -   -   3F0 4F0 3F1 4F1 3F2 4F2 -   -   4B0 4W0 3B0 3W0 3F3 4F3 4B1 ...

Memory: a device holds at most ``2 * ((S+2) // 2)`` chunk activations (F to W) — the paper's
``(p+2)//2`` micro-batches of a stage, half of 1F1B's ``S`` as ``S`` grows; per chunk
:func:`inflight` (read off the lists: F to W, at the device's peak).

Bubble (F = B = W = one unit, a device's work ``6m``): the iteration takes
``6m + 6 * ceil(S/2) - 7`` units (``6m + 1`` for ``S = 2``, ``6m`` for ``S = 1``;
:func:`makespan_units`, the simulator's value for every ``S <= 8``, ``2S <= m <= 32`` in
the tests, and for ``S`` up to 64 at ``m = 2S, 2S+1, 3S+1`` when it was written):
a bubble of about ``S / (2m)``, the paper's V-Half rate. Needs ``m >= 2S``.

Registered and searched; torch.distributed.pipelining has no class
for it: run it with autopipe's executor.

Tests: tests/schedules/v_shapes/test_v_block.py.
"""

from __future__ import annotations

from autopipe.schedules.action import Schedule, v_shape
from autopipe.schedules.lists import RankLists, to_schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.v_shapes import v_block

__all__ = ["SPEC", "bubble", "create_lists", "create_schedule", "inflight", "makespan_units", "pattern"]


def pattern(devices: int) -> v_block.Pattern:
    """V-Half's building block: per device, micro-batch 0's slots of F down, F up, B up, B down."""
    S, g = devices, 3 if devices % 2 == 0 else 0
    return tuple((2 * d, 3 * S - 2 - d, 3 * S - 1 + 2 * d + g, 6 * S - 2 - d + g) for d in range(S))


def create_lists(devices: int, micro_batches: int, virtual: int = 2) -> RankLists:
    """The V-Half lists as integer arrays (:mod:`~autopipe.schedules.lists`)."""
    v_block.check("v-half", devices, micro_batches, virtual)
    return v_block.lists(pattern(devices), micro_batches)


def create_schedule(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """The V-Half lists as Actions."""
    return to_schedule(create_lists(devices, micro_batches, virtual))


def inflight(devices: int, micro_batches: int, virtual: int = 2) -> tuple[float, ...]:
    """Per chunk, the micro-batches it holds (F run, W not) when its device holds the most."""
    v_block.check("v-half", devices, micro_batches, virtual)
    return v_block.held(pattern(devices), micro_batches)


def makespan_units(devices: int, micro_batches: int) -> int:
    """Iteration time when F, B and W of a chunk take one unit each (see the docstring)."""
    S, m = devices, micro_batches
    return 6 * m + (0 if S == 1 else 1 if S == 2 else 6 * ((S + 1) // 2) - 7)


def bubble(devices: int, micro_batches: int, virtual: int = 2) -> float:
    """``1 - 6m / makespan_units``, F, B and W of equal time."""
    return 1.0 - 6 * micro_batches / makespan_units(devices, micro_batches)


SPEC = ScheduleSpec(
    name="v-half",
    create_schedule=create_schedule,
    inflight=inflight,
    bubble=bubble,
    torch_class="",  # torch.distributed.pipelining has none
    preference=6,
    splits_backward=True,
    virtual_choices=(2,),
    min_micro_batches_per_device=v_block.PER_DEVICE,
    placement=v_shape,
    searched=True,
    create_lists=create_lists,
)
