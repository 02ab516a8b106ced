"""The full :class:`~autopipe.simulate.events.Timeline` of a compiled schedule, fast.

:func:`~autopipe.simulate.events.simulate` validates the schedule with its grid and walks it
with dictionaries: right for schedules from people, slow for the 300,000 actions of 64 devices
x 1,536 micro-batches x F, B, W (about 20 s). :func:`replay` gives the same Timeline, number for
number (the same operations, sums in the same order; tested): the schedule compiled
(:func:`~autopipe.simulate.events.compile_schedule`) and run by the simulator's core
(:mod:`autopipe.simulate.simcore`), then one pass to build the Timeline: what ``autopipe
show`` draws.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from autopipe.schedules.action import Placement, Schedule, round_robin
from autopipe.simulate import simcore
from autopipe.simulate.events import (
    ActionTiming,
    CompiledSchedule,
    StageCost,
    Timeline,
    compile_schedule,
    cost_arrays,
)
from autopipe.simulate.simcore import Floats

__all__ = ["replay"]

_F, _B = 0, 1  # CompiledSchedule.kind


def replay(
    schedule: Schedule,
    costs: Sequence[StageCost],
    comm_s: Sequence[float] = (),
    *,
    devices: int,
    virtual: int = 1,
    placement: Placement = round_robin,
) -> Timeline:
    """:func:`~autopipe.simulate.events.simulate` of ``schedule`` on ``devices`` ranks with
    ``virtual`` chunks each, ``costs[j]`` per virtual stage and ``comm_s[j]`` per boundary.

    Checks what it relies on as :func:`~autopipe.simulate.events.compile_schedule` does
    (one F and one B per stage and micro-batch, a W for all or none, each on its stage's rank,
    no deadlock), raising ScheduleError with the grid otherwise."""
    n = devices * virtual
    table, link = cost_arrays(n, [costs], [comm_s])
    c = compile_schedule(schedule, devices, virtual, placement)
    _, _, start, end = simcore.run(
        c.rank, c.duration, c.deps, c.hop, table.reshape(1, 8 * n), link, devices, starts=True
    )
    return _timeline(schedule, c, start, end, table)


def _timeline(schedule: Schedule, c: CompiledSchedule, start: Floats, end: Floats, table: Floats) -> Timeline:
    """The Timeline, busy time and memory of the run, each summed in simulate's order (busy:
    a running sum per rank, which ``np.cumsum`` does left to right; memory: the core's)."""
    n, devices = table.shape[1], c.ranks
    pos = np.concatenate(c.rank_lists)  # the ranks' own order -> dependency order
    begin, finish = start[pos], end[pos]
    owner = np.repeat(np.arange(devices), np.diff(c.offsets))
    acts = [a for r in range(devices) for a in schedule.get(r, []) if a is not None]
    actions = tuple(map(ActionTiming, acts, owner.tolist(), begin.tolist(), finish.tolist()))
    ran = finish - begin
    busy = tuple(
        float(np.cumsum(ran[lo:hi])[-1]) if hi > lo else 0.0 for lo, hi in itertools.pairwise(c.offsets.tolist())
    )
    peaks = simcore.memory(c.rows, c.offsets, c.home_array, c.splits_backward, table)[0]
    # In flight per stage: +1 at each F, -1 at each B, in its rank's order (a stage's actions
    # are all on its rank), the most at any point.
    stage, kind = c.rows[:, 0], c.rows[:, 1]
    by_stage = np.argsort(stage, kind="stable")
    running = np.cumsum(np.where(kind == _F, 1, np.where(kind == _B, -1, 0))[by_stage])
    counts = np.bincount(stage, minlength=n)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    before = np.where(first > 0, running[first - 1], 0)
    inflight = running - np.repeat(before, counts)
    peak_inflight = tuple(max(0, int(x)) for x in np.maximum.reduceat(inflight, first))
    iteration = float(end.max())
    bubble = 1.0 - sum(busy) / (devices * iteration) if iteration > 0 else 0.0
    return Timeline(actions, iteration, bubble, busy, tuple(peaks.tolist()), peak_inflight)
