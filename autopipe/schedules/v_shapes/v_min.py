"""V-Min, the V-shaped schedule with the least activation memory (Qi et al., "Pipeline
Parallelism with Controllable Memory", NeurIPS 2024, section 3: about a third of 1F1B's),
built as the authors build it.

``2S`` chunks in a V (:func:`~autopipe.schedules.action.v_shape`: device ``d`` runs chunk ``d``
and chunk ``2S-1-d``), backward split into B and W. The building block (:func:`pattern`, the
authors' ``stable_pattern_v_min``): device ``d`` runs micro-batch 0's forward down the V in
slot ``d`` and back up in slot ``2S-1-d``, its backward of the up chunk in slot ``2S+d+g``
and of the down chunk in ``4S-1-d+g`` (``g = 2`` when ``S`` is a multiple of 3, else 0, so no
two passes of a device share a slot modulo 6): every pass one slot after the one it waits
for. Repeated every 6 slots, squeezed and reordered by :mod:`~autopipe.schedules.v_shapes.v_block`.
``S=4``, ``m=8``, every pass one unit, the first 24 slots as the simulator times them ("-"
idle)::

    device 0 | 0F0 0F1 0F2 -   -   -   -   7F0 7B0 7W0 7F1 7B1 7W1 -   -   0B0 0W0 0F3 ...
    device 1 | -   1F0 1F1 -   -   -   6F0 -   6F1 6B0 6W0 1F2 -   -   1B0 6B1 6W1 1W0 ...
    device 2 | -   -   2F0 2F1 -   5F0 -   5F1 -   -   5B0 5W0 2F2 2B0 2W0 -   5B1 5F2 ...
    device 3 | -   -   -   3F0 4F0 3F1 4F1 -   -   -   -   4B0 3B0 4W0 3W0 3F2 4F2 4B1 ...

Memory: a device holds at most ``2 * ((S+4) // 3)`` chunk activations (F to W) — the paper's
``(p+4)//3`` micro-batches of a stage, a third of 1F1B's ``S`` as ``S`` grows; per chunk
:func:`inflight` (read off the lists: F to W, at the device's peak).

Bubble (F = B = W = one unit, a device's work ``6m``): the iteration takes
``6m + 4S - 5`` units, two fewer when ``S`` is a multiple of 3 (``6m`` for ``S = 1``;
:func:`makespan_units`, the simulator's value for every ``S <= 8``, ``2S <= m <= 32`` in
the tests, and for ``S`` up to 64 at ``m = 2S, 2S+1, 3S+1`` when it was written): a
bubble of about ``2S / (3m)``, the paper's V-Min rate, below 1F1B's ``(S-1)/m`` at about a
third of its memory. Needs ``m >= 2S``.

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
    """V-Min's building block: per device, micro-batch 0's slots of F down, F up, B up, B down."""
    S, g = devices, 2 if devices % 3 == 0 else 0
    return tuple((d, 2 * S - 1 - d, 2 * S + d + g, 4 * S - 1 - d + g) for d in range(S))


def create_lists(devices: int, micro_batches: int, virtual: int = 2) -> RankLists:
    """The V-Min lists as integer arrays (:mod:`~autopipe.schedules.lists`)."""
    v_block.check("v-min", devices, micro_batches, virtual)
    return v_block.lists(pattern(devices), micro_batches)


def create_schedule(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """The V-Min lists as Actions."""
    return to_schedule(create_lists(devices, micro_batches, virtual))


def inflight(devices: int, micro_batches: int, virtual: int = 2) -> tuple[float, ...]:
    """Per chunk, the micro-batches it holds (F run, W not) when its device holds the most."""
    v_block.check("v-min", devices, micro_batches, virtual)
    return v_block.held(pattern(devices), micro_batches)


def makespan_units(devices: int, micro_batches: int) -> int:
    """Iteration time when F, B and W of a chunk take one unit each (see the docstring)."""
    S, m = devices, micro_batches
    return 6 * m + (0 if S == 1 else 4 * S - 5 - (2 if S % 3 == 0 else 0))


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
    min_micro_batches_per_device=v_block.PER_DEVICE,
    placement=v_shape,
    searched=True,
    create_lists=create_lists,
)
