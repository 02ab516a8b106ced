"""Event simulation of a pipeline schedule: iteration time, bubble and peak memory per rank.

Each rank runs its action list in order; an action starts when its rank is free and its data
dependencies (:mod:`autopipe.schedules.deps`) have arrived::

    start(a) = max(end of the rank's previous action,
                   end(d) + comm(d -> a) for every dependency d of a)

A forward output of virtual stage ``j`` reaches ``j+1`` ``comm_s[j]`` seconds after F ends;
a B's input-gradient reaches ``j-1`` ``comm_s[j-1]`` seconds after B ends. A hop between
stages on the same rank (``S == 1``) costs nothing; which rank runs stage ``j`` is the
schedule's placement (``placement=``, its spec's; default ``j % S``). Links have no
contention: any number of transfers proceed at once, each taking its own ``comm_s``
(communication is not overlapped with compute on the sender or receiver's account either; it
only delays the consumer).

Memory is counted per rank, in the order the rank runs its list (no two actions of one rank
overlap): the static bytes of its stages, plus ``activation_bytes`` from the end of each F
until the end of its B (non-split) or, for a split backward, until B frees all but
``weight_grad_bytes``, which W frees; plus ``transient_bytes`` while a B runs.

With equal stage times the simulated bubble equals each schedule's textbook value
(``ScheduleSpec.bubble``): ``(S-1)/(m+S-1)`` for GPipe and 1F1B (Huang et al. 2019; Narayanan
et al. 2021), ``(S-1)/(v*m+S-1)`` for interleaved 1F1B, and ``(S-1)/(3m+S-1)`` for ZB-H1 when
F, B and W take equal time (Qi et al. 2023: bubble ``(S-1)(F+B-W)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Kind, Placement, Schedule, round_robin
from autopipe.schedules.deps import dependencies, execute_in_order
from autopipe.schedules.validate import validate

__all__ = [
    "ActionTiming",
    "CompiledSchedule",
    "StageCost",
    "Summary",
    "Timeline",
    "compile_schedule",
    "simulate",
    "simulate_summary",
]


@dataclass(frozen=True)
class StageCost:
    """What one virtual stage costs for one micro-batch."""

    forward_s: float
    backward_s: float  # full backward (input-grad + weight-grad): B when the schedule has no W
    backward_input_s: float  # B when the schedule splits backward
    backward_weight_s: float  # W
    activation_bytes: float  # held from the end of F until backward frees it
    weight_grad_bytes: float = 0.0  # of activation_bytes, still held after B until W (split only)
    transient_bytes: float = 0.0  # extra, alive only during a B (recomputed activations)
    static_bytes: float = 0.0  # parameters + gradients + optimizer state of this stage


@dataclass(frozen=True)
class ActionTiming:
    action: Action
    rank: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    actions: tuple[ActionTiming, ...]  # by rank, then in the order of the rank's list
    iteration_s: float  # makespan: end of the last action (all start at 0 or later)
    bubble_fraction: float  # 1 - sum(rank_busy_s) / (ranks * iteration_s)
    rank_busy_s: tuple[float, ...]  # compute time per rank
    peak_memory_bytes: tuple[float, ...]  # per rank: static + activations (+ transient) at worst
    peak_inflight: tuple[int, ...]  # per virtual stage: most micro-batches with F done, B not


def _check_inputs(
    schedule: Schedule,
    costs: Sequence[StageCost],
    comm_s: Sequence[float],
    devices: int | None,
    placement: Placement,
) -> tuple[int, tuple[float, ...]]:
    ranks = devices if devices is not None else max(schedule, default=-1) + 1
    if ranks < 1:
        raise ScheduleError("cannot simulate an empty schedule; give at least one rank")
    n = len(costs)
    if n == 0 or n % ranks:
        raise ScheduleError(
            f"costs must have one entry per virtual stage, a multiple of the {ranks} ranks "
            f"(got {n})"
        )
    comm = tuple(float(c) for c in comm_s) if comm_s else (0.0,) * max(n - 1, 0)
    if len(comm) != max(n - 1, 0):
        raise ScheduleError(
            f"comm_s must have one entry per stage boundary, {max(n - 1, 0)} for {n} "
            f"virtual stages (got {len(comm)})"
        )
    mbs = [a.microbatch for actions in schedule.values() for a in actions if a is not None]
    if not mbs:
        raise ScheduleError("cannot simulate a schedule without actions; give each rank its list")
    # Complete, well placed, ordered and deadlock-free, or a ScheduleError with the grid.
    validate(schedule, ranks, max(mbs) + 1, n // ranks, placement)
    return ranks, comm


def simulate(
    schedule: Schedule,
    costs: Sequence[StageCost],
    comm_s: Sequence[float] = (),
    *,
    devices: int | None = None,
    placement: Placement = round_robin,
) -> Timeline:
    """Simulate ``schedule`` with ``costs[j]`` per virtual stage and ``comm_s[j]`` per boundary.

    ``devices`` is the number of ranks (default: the highest rank in ``schedule`` plus one);
    ``len(costs) // devices`` is the number of virtual stages per rank, the highest
    micro-batch index plus one the number of micro-batches, and ``placement`` the schedule's
    (``ScheduleSpec.placement``: stage ``j`` on rank ``j % S`` by default). It is validated first
    (:func:`autopipe.schedules.validate`): an incomplete, misplaced or deadlocking schedule,
    or costs and comm_s of the wrong length, raise ScheduleError.
    """
    ranks, comm = _check_inputs(schedule, costs, comm_s, devices, placement)
    n = len(costs)
    home = [placement(j, ranks, n // ranks) for j in range(n)]
    execution = execute_in_order(schedule, n)
    split = {
        (a.stage, a.microbatch)
        for acts in schedule.values()
        for a in acts
        if a and a.kind is Kind.WEIGHT
    }

    def duration(a: Action) -> float:
        c = costs[a.stage]
        if a.kind is Kind.FORWARD:
            return c.forward_s
        if a.kind is Kind.WEIGHT:
            return c.backward_weight_s
        return c.backward_input_s if (a.stage, a.microbatch) in split else c.backward_s

    def hop(src: int, dst: int) -> float:
        if home[src] == home[dst]:
            return 0.0
        return comm[min(src, dst)]

    end: dict[Action, float] = {}
    timing: dict[tuple[int, int], ActionTiming] = {}
    free = [0.0] * ranks
    for rank, step in execution.order:
        a = schedule[rank][step]
        assert a is not None  # execute_in_order lists real actions only
        ready = max([free[rank]] + [end[d] + hop(d.stage, a.stage) for d in dependencies(a, n)])
        end[a] = ready + duration(a)
        free[rank] = end[a]
        timing[(rank, step)] = ActionTiming(a, rank, ready, end[a])

    ordered = tuple(timing[key] for key in sorted(timing))
    iteration = max((t.end_s for t in ordered), default=0.0)
    busy = [0.0] * ranks
    for t in ordered:
        busy[t.rank] += t.end_s - t.start_s
    bubble = 1.0 - sum(busy) / (ranks * iteration) if iteration > 0 else 0.0
    peak_memory, peak_inflight = _memory(schedule, costs, split, ranks, home)
    return Timeline(
        actions=ordered,
        iteration_s=iteration,
        bubble_fraction=bubble,
        rank_busy_s=tuple(busy),
        peak_memory_bytes=peak_memory,
        peak_inflight=peak_inflight,
    )


def _memory(
    schedule: Schedule,
    costs: Sequence[StageCost],
    split: set[tuple[int, int]],
    ranks: int,
    home: list[int],
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Peak bytes per rank and peak in-flight micro-batches per virtual stage (``home[j]``:
    the rank of stage ``j``)."""
    inflight = [0] * len(costs)
    peak_inflight = [0] * len(costs)
    peak_memory = []
    for rank in range(ranks):
        held = sum(c.static_bytes for j, c in enumerate(costs) if home[j] == rank)
        peak = held
        for a in schedule.get(rank, []):
            if a is None:
                continue
            c = costs[a.stage]
            if a.kind is Kind.FORWARD:
                held += c.activation_bytes
                inflight[a.stage] += 1
                peak_inflight[a.stage] = max(peak_inflight[a.stage], inflight[a.stage])
            elif a.kind is Kind.BACKWARD:
                peak = max(peak, held + c.transient_bytes)
                kept = c.weight_grad_bytes if (a.stage, a.microbatch) in split else 0.0
                held -= c.activation_bytes - kept
                inflight[a.stage] -= 1
            else:
                held -= c.weight_grad_bytes
            peak = max(peak, held)
        peak_memory.append(peak)
    return tuple(peak_memory), tuple(peak_inflight)


# --------------------------------------------------------------------------- fast path
#
# The planner prices hundreds of candidates on the same few schedules. A schedule is compiled
# once — validated, put in dependency order, each action's dependencies as positions in that
# order — and each candidate is then one pass over flat lists. ``simulate_summary`` gives the
# same iteration time, busy time and peak memory as :func:`simulate` (tested), without
# building a Timeline.

_F, _B, _W = 0, 1, 2


@dataclass(frozen=True)
class CompiledSchedule:
    """A validated schedule as flat lists, in an order that respects every dependency."""

    ranks: int  # S devices
    num_stages: int  # S * v
    home: tuple[int, ...]  # per virtual stage: the rank that runs it (the schedule's placement)
    rank: tuple[int, ...]  # per action, in dependency order
    stage: tuple[int, ...]
    kind: tuple[int, ...]  # 0 F, 1 B (input-grad if split), 2 W
    split: tuple[bool, ...]  # B of a (stage, micro-batch) that has a W
    deps: tuple[tuple[int, ...], ...]  # positions of the dependencies
    rank_lists: tuple[tuple[int, ...], ...]  # per rank, positions in the rank's own order


def compile_schedule(
    schedule: Schedule, devices: int, virtual: int = 1, placement: Placement = round_robin
) -> CompiledSchedule:
    """Lay ``schedule`` out for :func:`simulate_summary`.

    Checks what the fast path relies on — every (stage, micro-batch) has one F and one B (and
    a W for all or none), each action sits on its stage's rank (``placement``, the
    schedule's; default ``j % S``), and the lists run without
    deadlock — with integer keys, so it stays fast for tens of thousands of actions; the
    full :func:`~autopipe.schedules.validate` (with its grid) is for schedules from people.
    """
    n = devices * virtual
    home = tuple(placement(j, devices, virtual) for j in range(n))
    acts = [(r, a) for r in sorted(schedule) for a in schedule[r] if a is not None]
    if not acts:
        raise ScheduleError("cannot simulate a schedule without actions; give each rank its list")
    m = max(a.microbatch for _, a in acts) + 1
    kinds = {Kind.FORWARD: _F, Kind.BACKWARD: _B, Kind.WEIGHT: _W}

    def key(stage: int, kind: int, mb: int) -> int:
        return (stage * 3 + kind) * m + mb

    keys = [key(a.stage, kinds[a.kind], a.microbatch) for _, a in acts]
    has_w = any(a.kind is Kind.WEIGHT for _, a in acts)
    expected = n * m * (3 if has_w else 2)
    if len(set(keys)) != len(keys) or len(keys) != expected or any(home[a.stage] != r for r, a in acts):
        validate(schedule, devices, m, virtual, placement)  # raises with the grid and the bad step
        raise ScheduleError(f"schedule is incomplete: {len(keys)} actions, expected {expected}")
    lists = [[key(a.stage, kinds[a.kind], a.microbatch) for a in schedule.get(r, []) if a is not None] for r in range(devices)]
    # What each action waits for, as keys (see autopipe.schedules.deps).
    needs: list[list[tuple[int, ...]]] = []
    for lst in lists:
        row: list[tuple[int, ...]] = []
        for k in lst:
            stage, rest = divmod(k, 3 * m)
            kind = rest // m
            if kind == _F:
                row.append((k - 3 * m,) if stage > 0 else ())
            elif kind == _B:
                own = k - m  # F of the same stage and micro-batch
                row.append((own, k + 3 * m) if stage + 1 < n else (own,))
            else:
                row.append((k - m,))
        needs.append(row)
    position = [-1] * (n * 3 * m)
    rank_of: list[int] = []
    stage_of: list[int] = []
    kind_of: list[int] = []
    split_of: list[bool] = []
    deps: list[tuple[int, ...]] = []
    pointer = [0] * devices
    progress = True
    per_stage = 3 * m
    # A plain loop (no generators): this runs once per action, tens of thousands of times.
    while progress:
        progress = False
        for r in range(devices):
            lst, need_r, i, end = lists[r], needs[r], pointer[r], len(lists[r])
            while i < end:
                need = need_r[i]
                if len(need) == 2:
                    p0, p1 = position[need[0]], position[need[1]]
                    if p0 < 0 or p1 < 0:
                        break
                    dep: tuple[int, ...] = (p0, p1)
                elif need:
                    p0 = position[need[0]]
                    if p0 < 0:
                        break
                    dep = (p0,)
                else:
                    dep = ()
                k = lst[i]
                position[k] = len(rank_of)
                rank_of.append(r)
                stage, rest = divmod(k, per_stage)
                kind = rest // m
                stage_of.append(stage)
                kind_of.append(kind)
                split_of.append(kind == _B and has_w)
                deps.append(dep)
                i += 1
                progress = True
            pointer[r] = i
    if len(rank_of) != len(keys):
        validate(schedule, devices, m, virtual, placement)  # names the stuck steps
        raise ScheduleError("schedule deadlocks")
    rank_lists = tuple(tuple(position[k] for k in lst) for lst in lists)
    return CompiledSchedule(
        devices, n, home, tuple(rank_of), tuple(stage_of), tuple(kind_of), tuple(split_of), tuple(deps), rank_lists
    )


@dataclass(frozen=True)
class Summary:
    iteration_s: float
    bubble_fraction: float
    rank_busy_s: tuple[float, ...]
    peak_memory_bytes: tuple[float, ...]


def simulate_summary(c: CompiledSchedule, costs: Sequence[StageCost], comm_s: Sequence[float] = ()) -> Summary:
    """:func:`simulate`'s iteration time, bubble, busy time and peak memory, fast."""
    ranks, n = c.ranks, c.num_stages
    if len(costs) != n:
        raise ScheduleError(f"costs must have one entry per virtual stage ({n}), got {len(costs)}")
    comm = list(comm_s) if comm_s else [0.0] * (n - 1)
    fwd = [x.forward_s for x in costs]
    bwd = [x.backward_s for x in costs]
    bin_ = [x.backward_input_s for x in costs]
    wgt = [x.backward_weight_s for x in costs]
    end = [0.0] * len(c.rank)
    free = [0.0] * ranks
    busy = [0.0] * ranks
    stage_of, kind_of, split_of, deps, rank_of, home = c.stage, c.kind, c.split, c.deps, c.rank, c.home
    for i in range(len(rank_of)):
        r, j, k = rank_of[i], stage_of[i], kind_of[i]
        start = free[r]
        for d in deps[i]:
            sd = stage_of[d]
            t = end[d] if home[sd] == home[j] else end[d] + comm[sd if sd < j else j]
            if t > start:
                start = t
        dur = fwd[j] if k == _F else wgt[j] if k == _W else bin_[j] if split_of[i] else bwd[j]
        end[i] = start + dur
        free[r] = end[i]
        busy[r] += dur
    iteration = max(end) if end else 0.0
    peaks = []
    for r in range(ranks):
        held = sum(costs[j].static_bytes for j in range(n) if home[j] == r)
        peak = held
        for i in c.rank_lists[r]:
            x = costs[stage_of[i]]
            k = kind_of[i]
            if k == _F:
                held += x.activation_bytes
            elif k == _B:
                if held + x.transient_bytes > peak:
                    peak = held + x.transient_bytes
                held -= x.activation_bytes - (x.weight_grad_bytes if split_of[i] else 0.0)
            else:
                held -= x.weight_grad_bytes
            if held > peak:
                peak = held
        peaks.append(peak)
    bubble = 1.0 - sum(busy) / (ranks * iteration) if iteration > 0 else 0.0
    return Summary(iteration, bubble, tuple(busy), tuple(peaks))
