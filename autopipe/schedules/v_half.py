"""V-Half, the V-shaped schedule at half of 1F1B's activation memory (Qi et al., "Pipeline
Parallelism with Controllable Memory", NeurIPS 2024, section 3).

``2S`` chunks in a V (:func:`~autopipe.schedules.action.v_shape`: device ``d`` runs chunk ``d``
and chunk ``2S-1-d``), backward split into B and W, built from one building block
(:mod:`~autopipe.schedules.v_block`) like V-Min's but with the forwards on the way back up
two slots apart: every chunk's lifespan grows by about ``S`` slots, so devices hold more
micro-batches and the warm-up and cool-down shrink. ``S=4``, every action one unit, the
first 24 slots of ``m=8`` ("-" idle)::

    device 0 | 0F0 0F1 -   -   -   -   -   7F0 7B0 0F2 7W0 -   7F1 7B1 0F3 7W1 -   7F2 ...
    device 1 | -   1F0 1F1 -   -   -   6F0 -   -   6B0 1F2 6F1 6W0 -   6B1 1F3 6F2 6W1 ...
    device 2 | -   -   2F0 -   -   5F0 2F1 -   -   5F1 5B0 2F2 5W0 -   5F2 5B1 2F3 2B0 ...
    device 3 | -   -   -   3F0 4F0 -   -   3F1 4F1 -   -   4B0 3F2 4F2 3B0 4W0 3W0 4B1 ...

Memory: chunk ``j`` holds ``min(m, ceil(l_j / 6))`` micro-batches, ``l_j`` the slots from its
F to the end of its W (:func:`inflight`); a device, F to W, at most ``2 * ((S+2) // 2)``
chunk activations once ``m`` is large — the paper's ``(p+2)//2`` micro-batches of a stage,
half of 1F1B's ``S`` as ``S`` grows (tests/schedules/test_v_block.py).

Bubble (F = B = W = one unit, a device's work ``6m``): the iteration takes
``6m + max(0, floor(7S/2) - 4, 4S - 4 - m)`` units (:func:`makespan_units`, read off the
simulated block for ``S <= 12`` and checked against the simulator for every ``S <= 8``,
``m <= 32``; the last term is the longer warm-up of fewer than ``S/2`` micro-batches): a
bubble of about ``7S / (12m)``,
between V-Min's ``2S/(3m)`` and the ``S/(2m)`` the paper quotes for its V-Half (whose
block differs in detail; ours is the plain repeated block, its memory exactly the paper's).
Every ``m >= 1`` is handled.

Registered and searched; torch.distributed.pipelining has no class
for it: run it with autopipe's executor.
"""

from __future__ import annotations

from functools import cache

from autopipe.schedules import v_block
from autopipe.schedules.action import Schedule, v_shape
from autopipe.schedules.spec import ScheduleSpec

__all__ = ["GAPS", "SPEC", "bubble", "create_schedule", "inflight", "makespan_units"]

GAPS = v_block.Gaps(up_f=2)  # forwards back up the V two slots apart


@cache
def _block(devices: int) -> v_block.Block:
    return v_block.block(devices, GAPS)


def create_schedule(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """The V-Half lists: ``micro_batches`` copies of the block, 6 slots apart."""
    v_block.check_virtual("v-half", devices, micro_batches, virtual)
    return v_block.repeat(_block(devices), devices, micro_batches)


def inflight(devices: int, micro_batches: int, virtual: int = 2) -> tuple[float, ...]:
    """Per chunk, the micro-batches it holds from F to W: ``min(m, ceil(lifespan / 6))``."""
    v_block.check_virtual("v-half", devices, micro_batches, virtual)
    return v_block.inflight(_block(devices), devices, micro_batches)


def makespan_units(devices: int, micro_batches: int) -> int:
    """Iteration time when F, B and W of a chunk take one unit each (see the docstring)."""
    S, m = devices, micro_batches
    return 6 * m + max(0, 7 * S // 2 - 4, 4 * S - 4 - m)


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
    placement=v_shape,
    searched=True,
)
