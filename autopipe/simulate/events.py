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
``weight_grad_bytes``, which W frees; plus ``transient_bytes`` while a B or a W runs (what the
backward makes and frees: the gradients flowing through, recomputed activations).

With equal stage times the simulated bubble equals each schedule's textbook value
(``ScheduleSpec.bubble``): ``(S-1)/(m+S-1)`` for GPipe and 1F1B (Huang et al. 2019; Narayanan
et al. 2021), ``(S-1)/(v*m+S-1)`` for interleaved 1F1B, and ``(S-1)/(3m+S-1)`` for ZB-H1 when
F, B and W take equal time (Qi et al. 2023: bubble ``(S-1)(F+B-W)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Kind, Placement, Schedule, round_robin
from autopipe.schedules.deps import dependencies, execute_in_order
from autopipe.schedules.lists import F, RankLists, W, from_schedule, rank_array, to_schedule
from autopipe.schedules.validate import validate
from autopipe.simulate import simcore
from autopipe.simulate.simcore import Floats, Index, Ints

__all__ = [
    "ActionTiming",
    "CompiledSchedule",
    "StageCost",
    "Summary",
    "Timeline",
    "compile_lists",
    "compile_schedule",
    "cost_arrays",
    "cost_table",
    "simulate",
    "simulate_many",
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
        raise ScheduleError(f"costs must have one entry per virtual stage, a multiple of the {ranks} ranks (got {n})")
    comm = tuple(float(c) for c in comm_s) if comm_s else (0.0,) * max(n - 1, 0)
    if len(comm) != max(n - 1, 0):
        raise ScheduleError(
            f"comm_s must have one entry per stage boundary, {max(n - 1, 0)} for {n} virtual stages (got {len(comm)})"
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
    split = {(a.stage, a.microbatch) for acts in schedule.values() for a in acts if a and a.kind is Kind.WEIGHT}

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
                peak = max(peak, held + c.transient_bytes)
                held -= c.weight_grad_bytes
            peak = max(peak, held)
        peak_memory.append(peak)
    return tuple(peak_memory), tuple(peak_inflight)


# --------------------------------------------------------------------------- fast path
#
# The planner prices hundreds of candidates on the same few schedules. A schedule is compiled
# once — checked, put in dependency order, each action's dependencies as positions in that
# order — and each candidate is then one pass over flat arrays (autopipe.simulate.simcore: C
# when built, else Python). ``simulate_summary`` gives the same iteration time, busy time and
# peak memory as :func:`simulate` (tested), without building a Timeline.


@dataclass(frozen=True, eq=False)
class CompiledSchedule:
    """A checked schedule as flat arrays, in an order that respects every dependency."""

    ranks: int  # S devices
    num_stages: int  # S * v
    home: tuple[int, ...]  # per virtual stage: the rank that runs it (the schedule's placement)
    rank: Index  # per action, in dependency order
    stage: Index
    kind: Index  # 0 F, 1 B (input-grad if split), 2 W
    split: npt.NDArray[np.bool_]  # B of a (stage, micro-batch) that has a W
    deps: Index  # (N, 2): positions of the dependencies, -1 none
    rank_lists: tuple[Index, ...]  # per rank, positions in the rank's own order
    hop: Index  # (N, 2): the comm_s index each dependency pays, -1 none (same rank)
    duration: Index  # stage * 8 + 0 F, 1 B, 2 B input-grad, 3 W: where its time is in cost_table()
    rows: Ints  # (N, 3) the ranks' (stage, kind, micro-batch) rows, rank after rank
    offsets: Ints  # (S + 1,): rank r's rows are rows[offsets[r]:offsets[r + 1]]
    home_array: Ints  # home as an array
    splits_backward: bool  # has W actions


def compile_lists(
    lists: RankLists, devices: int, virtual: int = 1, placement: Placement = round_robin
) -> CompiledSchedule:
    """Lay the ranks' lists out for :func:`simulate_summary`.

    Checks what the fast path relies on — every (stage, micro-batch) has one F and one B (and a W
    for all or none), each action sits on its stage's rank (``placement``, the schedule's;
    default ``j % S``), and the lists run without deadlock — raising ScheduleError with
    :func:`~autopipe.schedules.validate`'s grid otherwise."""
    return _compile(lists, devices, virtual, placement, None)


def compile_schedule(
    schedule: Schedule, devices: int, virtual: int = 1, placement: Placement = round_robin
) -> CompiledSchedule:
    """:func:`compile_lists` of ``schedule`` (errors name its steps, idle slots counted)."""
    return _compile(from_schedule(schedule, devices), devices, virtual, placement, schedule)


def _compile(
    lists: RankLists, devices: int, virtual: int, placement: Placement, schedule: Schedule | None
) -> CompiledSchedule:
    n = devices * virtual
    home = tuple(placement(j, devices, virtual) for j in range(n))
    home_array = np.asarray(home, np.int64)
    if len(lists) != devices:
        raise ScheduleError(f"the lists have {len(lists)} ranks, expected one per device ({devices})")
    arrays = [rank_array(x) for x in lists]
    rows = np.concatenate(arrays)
    if not len(rows):
        raise ScheduleError("cannot simulate a schedule without actions; give each rank its list")
    offsets = np.concatenate(([0], np.cumsum([len(x) for x in arrays]))).astype(np.int64)
    m = int(rows[:, 2].max()) + 1
    has_w = bool((rows[:, 1] == W).any())
    expected = n * m * (3 if has_w else 2)
    placed, o = -1, None
    if len(rows) == expected:
        placed, o = simcore.order(rows, offsets, home_array, m, has_w)
    if o is None or placed != len(rows):
        bad = np.flatnonzero((rows[:, 1] < F) | (rows[:, 1] > W))
        if len(bad):
            r = int(np.searchsorted(offsets, bad[0], side="right")) - 1
            raise ScheduleError(f"rank {r} has an action of kind {int(rows[bad[0], 1])}; kinds are 0 F, 1 B, 2 W")
        if m <= len(rows):  # validate's grid says which step is wrong or stuck
            validate(schedule if schedule is not None else to_schedule(tuple(arrays)), devices, m, virtual, placement)
        raise ScheduleError(
            "schedule deadlocks" if placed >= 0 else f"schedule is incomplete: {len(rows)} actions, expected {expected}"
        )
    rank_lists = tuple(np.split(o.pos, offsets[1:-1]))
    return CompiledSchedule(
        devices,
        n,
        home,
        o.rank,
        o.stage,
        o.kind,
        o.split,
        o.dep,
        rank_lists,
        o.hop,
        o.dur,
        rows,
        offsets,
        home_array,
        has_w,
    )


@dataclass(frozen=True)
class Summary:
    iteration_s: float
    bubble_fraction: float
    rank_busy_s: tuple[float, ...]
    peak_memory_bytes: tuple[float, ...]


def simulate_summary(c: CompiledSchedule, costs: Sequence[StageCost], comm_s: Sequence[float] = ()) -> Summary:
    """:func:`simulate`'s iteration time, bubble, busy time and peak memory, fast."""
    return simulate_many(c, [costs], [comm_s])[0]


def simulate_many(
    c: CompiledSchedule, costs: Sequence[Sequence[StageCost]], comm_s: Sequence[Sequence[float]] = ()
) -> list[Summary]:
    """:func:`simulate_summary` of K candidates on one compiled schedule, in one pass each:
    ``costs[k]`` per virtual stage and ``comm_s[k]`` per boundary (``()``: no link times)."""
    n, k = c.num_stages, len(costs)
    table, link = cost_arrays(n, costs, comm_s)
    if k == 0:
        return []
    iteration, busy, _, _ = simcore.run(c.rank, c.duration, c.deps, c.hop, table.reshape(k, 8 * n), link, c.ranks)
    peak = simcore.memory(c.rows, c.offsets, c.home_array, c.splits_backward, table)
    out = []
    for i in range(k):
        it, b = float(iteration[i]), busy[i].tolist()
        bubble = 1.0 - sum(b) / (c.ranks * it) if it > 0 else 0.0
        out.append(Summary(it, bubble, tuple(b), tuple(peak[i].tolist())))
    return out


def cost_arrays(
    n: int, costs: Sequence[Sequence[StageCost]], comm_s: Sequence[Sequence[float]] = ()
) -> tuple[Floats, Floats]:
    """K candidates' costs and link times on ``n`` virtual stages, checked: the ``(K, n, 8)``
    :func:`cost_table` and the ``(K, n-1)`` link times (``comm_s`` ``()`` or an empty entry: none)."""
    k = len(costs)
    comms = [list(x) for x in comm_s] if comm_s else [[] for _ in costs]
    if len(comms) != k:
        raise ScheduleError(f"comm_s must have one entry per candidate ({k}), got {len(comms)}")
    for cs, cm in zip(costs, comms, strict=True):
        if len(cs) != n:
            raise ScheduleError(f"costs must have one entry per virtual stage ({n}), got {len(cs)}")
        if cm and len(cm) != n - 1:
            raise ScheduleError(
                f"comm_s must have one entry per stage boundary, {n - 1} for {n} virtual stages (got {len(cm)})"
            )
    table = cost_table(costs) if k else np.empty((0, n, 8), np.float64)
    return table, np.array([cm or [0.0] * (n - 1) for cm in comms], np.float64).reshape(k, n - 1)


def cost_table(costs: Sequence[Sequence[StageCost]]) -> Floats:
    """K candidates' stage costs as one ``(K, n, 8)`` array, StageCost's fields in order."""
    return np.array(
        [
            [
                (
                    x.forward_s,
                    x.backward_s,
                    x.backward_input_s,
                    x.backward_weight_s,
                    x.activation_bytes,
                    x.weight_grad_bytes,
                    x.transient_bytes,
                    x.static_bytes,
                )
                for x in cs
            ]
            for cs in costs
        ],
        np.float64,
    ).reshape(len(costs), -1, 8)
