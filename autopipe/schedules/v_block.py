"""V-shape building blocks: a schedule as one micro-batch's pattern repeated every 6 slots
(Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS 2024, sections 2-3).

With every F, B and W of a chunk taking one slot, a device of a V (two chunks, ``down = d``
and ``up = 2S-1-d``, :func:`~autopipe.schedules.action.v_shape`) does six slots of work per
micro-batch. A *building block* gives the slot of each of those six actions for micro-batch
0; micro-batch ``i`` runs the same block ``6i`` slots later, and each device's action list is
its actions sorted by slot. The block here is the one micro-batch's dependency chain, laid out
slot by slot:

- forwards down the V and back up: chunk ``j+1`` starts ``gap`` slots after chunk ``j`` (the
  down-leg and up-leg gaps of :class:`Gaps`; one at the turn, chunks ``S-1`` and ``S``, which
  share a device);
- backwards from chunk ``2S-1`` back to chunk 0, with their own gaps;
- each W in the first slot after its B that its device has free;

and an action whose slot is taken on its device (the same slot modulo 6, by an action of the
block) moves to the next free one, so a device never runs two actions at once once the blocks
overlap. Any ``m >= 1`` is handled: the lists are in the order of a feasible timetable, so they
validate and never deadlock.

Memory (the paper's lifespan rule): a chunk whose F starts in slot ``f`` and whose W ends
``l`` slots later holds ``ceil(l / 6)`` micro-batches (fewer when ``m`` is smaller) — in the
list order, after the F of micro-batch ``k`` the Ws of micro-batches ``k-ceil(l/6)+1 .. k``
are still to come (:func:`inflight`). Tight gaps (V-Min) make the lifespans short; longer
up-leg gaps (V-Half) trade memory for a shorter warm-up and cool-down.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Kind, Schedule, v_shape
from autopipe.schedules.validate import check_sizes

__all__ = ["PERIOD", "Block", "Gaps", "block", "check_virtual", "inflight", "repeat"]

F, B, W = Kind.FORWARD, Kind.BACKWARD, Kind.WEIGHT
PERIOD = 6  # slots of work per micro-batch on a device: F, B, W of two chunks

Block = dict[tuple[int, Kind], int]  # (chunk, kind) -> slot of micro-batch 0


@dataclass(frozen=True)
class Gaps:
    """Slots from one chunk's action to the next chunk's along the chain (at least one)."""

    down_f: int = 1  # F of chunk j -> F of chunk j+1, j < S-1 (down the V)
    up_f: int = 1  # F of chunk j -> F of chunk j+1, S <= j < 2S-1 (back up)
    up_b: int = 1  # B of chunk j -> B of chunk j-1, j > S (down the up leg, backwards)
    down_b: int = 1  # B of chunk j -> B of chunk j-1, j < S


def block(devices: int, gaps: Gaps) -> Block:
    """The slot of every (chunk, kind) of micro-batch 0 on ``devices`` devices in a V."""
    S = devices
    taken: dict[int, set[int]] = {d: set() for d in range(S)}
    slots: Block = {}

    def place(chunk: int, kind: Kind, earliest: int) -> int:
        device, slot = v_shape(chunk, S, 2), earliest
        while slot % PERIOD in taken[device]:
            slot += 1
        taken[device].add(slot % PERIOD)
        slots[chunk, kind] = slot
        return slot

    t = 0
    for j in range(2 * S):
        start = place(j, F, t)
        t = start + (1 if j in (S - 1, 2 * S - 1) else gaps.down_f if j < S else gaps.up_f)
    for j in reversed(range(2 * S)):
        start = place(j, B, t)
        t = start + (1 if j == S else gaps.up_b if j > S else gaps.down_b)
    for j in sorted(range(2 * S), key=lambda c: slots[c, B]):
        place(j, W, slots[j, B] + 1)
    return slots


def repeat(slots: Block, devices: int, micro_batches: int) -> Schedule:
    """Each device's actions of ``micro_batches`` copies of the block, ``PERIOD`` slots apart,
    in slot order."""
    timed: dict[int, list[tuple[int, Action]]] = {d: [] for d in range(devices)}
    for (chunk, kind), slot in slots.items():
        device = v_shape(chunk, devices, 2)
        for i in range(micro_batches):
            timed[device].append((slot + PERIOD * i, Action(chunk, kind, i)))
    return {d: [a for _, a in sorted(timed[d])] for d in range(devices)}


def inflight(slots: Block, devices: int, micro_batches: int) -> tuple[float, ...]:
    """Per chunk, ``min(m, ceil(lifespan / 6))``: the lifespan runs from the start of its F to
    the end of its W (what it holds until its weight gradient is done)."""
    return tuple(
        float(min(micro_batches, -(-(slots[j, W] + 1 - slots[j, F]) // PERIOD)))
        for j in range(2 * devices)
    )


def check_virtual(name: str, devices: int, micro_batches: int, virtual: int) -> None:
    """Positive sizes, and ``virtual == 2`` (two chunks per device in a V), or ScheduleError."""
    check_sizes(devices, micro_batches, virtual)
    if virtual != 2:
        raise ScheduleError(
            f"{name} runs two chunks per device in a V (got virtual: {virtual}); use virtual=2"
        )
