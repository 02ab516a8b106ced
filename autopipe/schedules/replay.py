"""The full :class:`~autopipe.schedules.simulate.Timeline` of a compiled schedule, fast.

:func:`~autopipe.schedules.simulate.simulate` validates the schedule with its grid and walks it
with dictionaries: right for schedules from people, slow for the 300,000 actions of 64 devices
x 1,536 micro-batches x F, B, W (about 20 s). :func:`replay` gives the same Timeline, number for
number (the same operations, sums in the same order; tested): the schedule compiled
(:func:`~autopipe.schedules.simulate.compile_schedule`) and run by the simulator's core
(:mod:`autopipe.schedules.simcore`), then one pass to build the Timeline: what ``autopipe
show`` draws.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autopipe.errors import ScheduleError
from autopipe.schedules import simcore
from autopipe.schedules.action import Placement, Schedule, round_robin
from autopipe.schedules.simulate import (
    ActionTiming,
    CompiledSchedule,
    StageCost,
    Timeline,
    compile_schedule,
)

__all__ = ["replay"]

_F, _B, _W = 0, 1, 2  # CompiledSchedule.kind


def replay(
    schedule: Schedule,
    costs: Sequence[StageCost],
    comm_s: Sequence[float] = (),
    *,
    devices: int,
    virtual: int = 1,
    placement: Placement = round_robin,
) -> Timeline:
    """:func:`~autopipe.schedules.simulate.simulate` of ``schedule`` on ``devices`` ranks with
    ``virtual`` chunks each, ``costs[j]`` per virtual stage and ``comm_s[j]`` per boundary.

    Checks what it relies on as :func:`~autopipe.schedules.simulate.compile_schedule` does
    (one F and one B per stage and micro-batch, a W for all or none, each on its stage's rank,
    no deadlock), raising ScheduleError with the grid otherwise."""
    n = devices * virtual
    if len(costs) != n:
        raise ScheduleError(f"costs must have one entry per virtual stage ({n}), got {len(costs)}")
    comm = [float(x) for x in comm_s] if comm_s else [0.0] * (n - 1)
    if len(comm) != n - 1:
        raise ScheduleError(f"comm_s must have one entry per stage boundary, {n - 1} for {n} virtual stages (got {len(comm)})")
    c = compile_schedule(schedule, devices, virtual, placement)
    times = np.array([[(x.forward_s, x.backward_s, x.backward_input_s, x.backward_weight_s) for x in costs]], np.float64)
    _, _, start, end = simcore.run(c.rank, c.duration, c.deps, c.hop, times.reshape(1, 4 * n), np.array([comm], np.float64).reshape(1, n - 1), devices)
    return _timeline(schedule, c, start.tolist(), end.tolist(), costs)


def _timeline(schedule: Schedule, c: CompiledSchedule, start: list[float], end: list[float], costs: Sequence[StageCost]) -> Timeline:
    """The Timeline, busy time and memory of the run, each summed in simulate's order."""
    n, devices = len(costs), c.ranks
    stage, kind, split = c.stage.tolist(), c.kind.tolist(), c.split.tolist()
    actions: list[ActionTiming] = []
    busy, peaks = [0.0] * devices, []
    inflight, peak_inflight = [0] * n, [0] * n
    for r in range(devices):
        row = [a for a in schedule.get(r, []) if a is not None]
        held = sum(x.static_bytes for j, x in enumerate(costs) if c.home[j] == r)
        peak = held
        for a, i in zip(row, c.rank_lists[r].tolist(), strict=True):
            s, e = start[i], end[i]
            actions.append(ActionTiming(a, r, s, e))
            busy[r] += e - s
            j, k = stage[i], kind[i]
            x = costs[j]
            if k == _F:
                held += x.activation_bytes
                inflight[j] += 1
                if inflight[j] > peak_inflight[j]:
                    peak_inflight[j] = inflight[j]
            elif k == _B:
                peak = max(peak, held + x.transient_bytes)
                held -= x.activation_bytes - (x.weight_grad_bytes if split[i] else 0.0)
                inflight[j] -= 1
            else:
                held -= x.weight_grad_bytes
            peak = max(peak, held)
        peaks.append(peak)
    iteration = max(end, default=0.0)
    bubble = 1.0 - sum(busy) / (devices * iteration) if iteration > 0 else 0.0
    return Timeline(tuple(actions), iteration, bubble, tuple(busy), tuple(peaks), tuple(peak_inflight))
