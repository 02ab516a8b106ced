"""V-Min, the V-shaped schedule with the least activation memory (Qi et al., "Pipeline
Parallelism with Controllable Memory", NeurIPS 2024, section 3: about a third of 1F1B's).

``2S`` chunks in a V (:func:`~autopipe.schedules.action.v_shape`: device ``d`` runs chunk ``d``
and chunk ``2S-1-d``), backward split into B and W, built from one building block
(:mod:`~autopipe.schedules.v_block`) with every gap one slot: a micro-batch's forwards run
down the V and back up one slot apart, its backwards straight back, each W in the first slot
its device has free after the B. Micro-batch ``i`` repeats the block ``6i`` slots later.
``S=4``, every action one unit, the first 24 slots of ``m=8`` ("-" idle)::

    device 0 | 0F0 0F1 -   -   -   -   -   7F0 7B0 7W0 0F2 -   -   7F1 7B1 0B0 7W1 0W0 ...
    device 1 | -   1F0 -   -   -   -   6F0 1F1 -   6B0 6W0 -   6F1 1F2 1B0 6B1 6W1 1W0 ...
    device 2 | -   -   2F0 -   -   5F0 -   -   2F1 -   5B0 5F1 5W0 2B0 2F2 2W0 5B1 5F2 ...
    device 3 | -   -   -   3F0 4F0 -   -   -   -   3F1 4F1 4B0 3B0 4W0 3W0 3F2 4F2 4B1 ...

Memory: chunk ``j`` holds ``min(m, ceil(l_j / 6))`` micro-batches, ``l_j`` the slots from its
F to the end of its W (:func:`inflight`); a device, F to W, at most ``2 * ((S+4) // 3)``
chunk activations once ``m`` is large — the paper's ``(p+4)//3`` micro-batches of a stage, a
third of 1F1B's ``S`` as ``S`` grows (tests/schedules/test_v_block.py checks it against the
simulator).

Bubble (F = B = W = one unit, a device's work ``6m``): the iteration takes
``6m + 4S - 5`` units, and ``6m`` for ``S = 1``; two more when ``S`` is a multiple of 3
above 3 and ``m >= 2``: then ``2S`` is a multiple of the 6-slot period, so device 0's two
backwards (chunks ``2S-1`` and 0) each land on one of its forwards' slots and step one slot
later (at ``S = 3`` it costs nothing). :func:`makespan_units` was read off the simulated
block (for ``S <= 12``) and is checked against the simulator for every ``S <= 8``,
``m <= 32``: a bubble of about ``2S / (3m)``, the paper's V-Min rate,
below 1F1B's ``(S-1)/m`` at about a third of its memory for large ``S``. Every ``m >= 1``
is handled.

Registered and searched; torch.distributed.pipelining has no class
for it: run it with autopipe's executor.
"""

from __future__ import annotations

from functools import cache

from autopipe.schedules import v_block
from autopipe.schedules.action import Schedule, v_shape
from autopipe.schedules.spec import ScheduleSpec

__all__ = ["GAPS", "SPEC", "bubble", "create_schedule", "inflight", "makespan_units"]

GAPS = v_block.Gaps()  # every gap one slot: the shortest lifespans


@cache
def _block(devices: int) -> v_block.Block:
    return v_block.block(devices, GAPS)


def create_schedule(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """The V-Min lists: ``micro_batches`` copies of the block, 6 slots apart."""
    v_block.check_virtual("v-min", devices, micro_batches, virtual)
    return v_block.repeat(_block(devices), devices, micro_batches)


def inflight(devices: int, micro_batches: int, virtual: int = 2) -> tuple[float, ...]:
    """Per chunk, the micro-batches it holds from F to W: ``min(m, ceil(lifespan / 6))``."""
    v_block.check_virtual("v-min", devices, micro_batches, virtual)
    return v_block.inflight(_block(devices), devices, micro_batches)


def makespan_units(devices: int, micro_batches: int) -> int:
    """Iteration time when F, B and W of a chunk take one unit each (see the docstring)."""
    S, m = devices, micro_batches
    late = 2 if S % 3 == 0 and S > 3 and m >= 2 else 0
    return 6 * m + max(0, 4 * S - 5 + late)


def bubble(devices: int, micro_batches: int, virtual: int = 2) -> float:
    """``1 - 6m / makespan_units``, F, B and W of equal time."""
    return 1.0 - 6 * micro_batches / makespan_units(devices, micro_batches)


SPEC = ScheduleSpec(
    name="v-min",
    create_schedule=create_schedule,
    inflight=inflight,
    bubble=bubble,
    torch_class="",  # torch.distributed.pipelining has none
    preference=8,
    splits_backward=True,
    virtual_choices=(2,),
    placement=v_shape,
    searched=True,
)
