"""The full :class:`~autopipe.schedules.simulate.Timeline` of a compiled schedule, fast.

:func:`~autopipe.schedules.simulate.simulate` validates the schedule with its grid and walks it
with dictionaries: right for schedules from people, slow for the 300,000 actions of 64 devices
x 1,536 micro-batches x F, B, W (about 20 s). :func:`replay` gives the same Timeline, number for
number (the same operations, sums in the same order; tested), in one pass over flat lists keyed
by integers (``(stage * 3 + kind) * m + micro-batch``), in a few seconds: what ``autopipe
show`` draws.
"""

from __future__ import annotations

from collections.abc import Sequence

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Kind, Placement, Schedule, round_robin
from autopipe.schedules.simulate import ActionTiming, StageCost, Timeline
from autopipe.schedules.validate import validate

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
    home = [placement(j, devices, virtual) for j in range(n)]
    acts = [[a for a in schedule.get(r, []) if a is not None] for r in range(devices)]
    if not any(acts) or any(r not in range(devices) for r in schedule):
        validate(schedule, devices, 1, virtual, placement)
        raise ScheduleError("cannot simulate a schedule without actions; give each rank its list")
    m = max(a.microbatch for row in acts for a in row) + 1
    kinds = {Kind.FORWARD: _F, Kind.BACKWARD: _B, Kind.WEIGHT: _W}
    lists = [[(a.stage * 3 + kinds[a.kind]) * m + a.microbatch for a in row] for row in acts]
    has_w = any(a.kind is Kind.WEIGHT for row in acts for a in row)
    count = sum(len(row) for row in lists)
    if (
        count != n * m * (3 if has_w else 2)
        or len({k for row in lists for k in row}) != count
        or any(a.stage >= n or home[a.stage] != r for r, row in enumerate(acts) for a in row)
    ):
        validate(schedule, devices, m, virtual, placement)  # raises with the grid and the bad step
        raise ScheduleError(f"schedule is incomplete: {count} actions, expected {n * m * (3 if has_w else 2)}")
    dur = [0.0] * (3 * n)  # per stage * 3 + kind
    for j, x in enumerate(costs):
        dur[3 * j : 3 * j + 3] = [x.forward_s, x.backward_input_s if has_w else x.backward_s, x.backward_weight_s]
    into = [0.0] + [0.0 if home[j - 1] == home[j] else comm[j - 1] for j in range(1, n)]  # F(j-1) -> F(j)
    back = [0.0 if home[j + 1] == home[j] else comm[j] for j in range(n - 1)] + [0.0]  # B(j+1) -> B(j)
    end = [-1.0] * (3 * n * m)  # by key; -1: not run yet
    starts: list[list[float]] = [[] for _ in range(devices)]
    free, pointer, per_stage = [0.0] * devices, [0] * devices, 3 * m
    progress = True
    while progress:  # each rank runs its list in order, each action once its inputs have ended
        progress = False
        for r in range(devices):
            lst, i, f, begun = lists[r], pointer[r], free[r], starts[r]
            while i < len(lst):
                k = lst[i]
                sk = k // m
                stage, kind = divmod(sk, 3)
                if kind == _F:
                    ready = f
                    if stage > 0:
                        e = end[k - per_stage]
                        if e < 0:
                            break
                        t = e + into[stage]
                        ready = t if t > f else f
                else:
                    e = end[k - m]  # F of the same stage (for B), B (for W)
                    if e < 0:
                        break
                    ready = e if e > f else f
                    if kind == _B and stage + 1 < n:
                        e = end[k + per_stage]
                        if e < 0:
                            break
                        t = e + back[stage]
                        ready = t if t > ready else ready
                f = ready + dur[sk]
                end[k] = f
                begun.append(ready)
                i += 1
                progress = True
            pointer[r], free[r] = i, f
    if any(pointer[r] < len(lists[r]) for r in range(devices)):
        validate(schedule, devices, m, virtual, placement)  # names the stuck steps
        raise ScheduleError("schedule deadlocks")
    return _timeline(acts, lists, starts, end, costs, home, m, has_w)


def _timeline(
    acts: list[list[Action]],
    lists: list[list[int]],
    starts: list[list[float]],
    end: list[float],
    costs: Sequence[StageCost],
    home: list[int],
    m: int,
    has_w: bool,
) -> Timeline:
    """The Timeline, busy time and memory of the run, each summed in simulate's order."""
    n = len(costs)
    actions: list[ActionTiming] = []
    busy, peaks = [0.0] * len(acts), []
    inflight, peak_inflight = [0] * n, [0] * n
    for r, row in enumerate(acts):
        held = sum(x.static_bytes for j, x in enumerate(costs) if home[j] == r)
        peak = held
        for a, k, s in zip(row, lists[r], starts[r], strict=True):
            e = end[k]
            actions.append(ActionTiming(a, r, s, e))
            busy[r] += e - s
            j, kind = divmod(k // m, 3)
            x = costs[j]
            if kind == _F:
                held += x.activation_bytes
                inflight[j] += 1
                if inflight[j] > peak_inflight[j]:
                    peak_inflight[j] = inflight[j]
            elif kind == _B:
                peak = max(peak, held + x.transient_bytes)
                held -= x.activation_bytes - (x.weight_grad_bytes if has_w else 0.0)
                inflight[j] -= 1
            else:
                held -= x.weight_grad_bytes
            peak = max(peak, held)
        peaks.append(peak)
    iteration = max(end, default=0.0)
    bubble = 1.0 - sum(busy) / (len(acts) * iteration) if iteration > 0 else 0.0
    return Timeline(tuple(actions), iteration, bubble, tuple(busy), tuple(peaks), tuple(peak_inflight))
