"""Event simulation of a pipeline schedule: iteration time, bubble and peak memory per rank.

Each rank runs its action list in order; an action starts when its rank is free and its data
dependencies (:mod:`autopipe.schedules.deps`) have arrived::

    start(a) = max(end of the rank's previous action,
                   end(d) + comm(d -> a) for every dependency d of a)

A forward output of virtual stage ``j`` reaches ``j+1`` ``comm_s[j]`` seconds after F ends;
a B's input-gradient reaches ``j-1`` ``comm_s[j-1]`` seconds after B ends. A hop between
stages on the same rank (``S == 1``) costs nothing. Links have no contention: any number of
transfers proceed at once, each taking its own ``comm_s`` (communication is not overlapped
with compute on the sender or receiver's account either; it only delays the consumer).

Memory is counted per rank, in the order the rank runs its list (no two actions of one rank
overlap): the static bytes of its stages, plus ``activation_bytes`` from the end of each F
until the end of its B (non-split) or, for a split backward, until B frees all but
``weight_grad_bytes``, which W frees; plus ``transient_bytes`` while a B runs.

With equal stage times the simulated bubble equals the textbook values of
:func:`bubble_formula`: ``(S-1)/(m+S-1)`` for GPipe and 1F1B (Huang et al. 2019; Narayanan et
al. 2021), ``(S-1)/(v*m+S-1)`` for interleaved 1F1B, and ``(S-1)/(3m+S-1)`` for ZB-H1 when
F, B and W take equal time (Qi et al. 2023: bubble ``(S-1)(F+B-W)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Schedule
from autopipe.schedules.deps import dependencies, execute_in_order
from autopipe.schedules.validate import validate

__all__ = ["ActionTiming", "StageCost", "Timeline", "bubble_formula", "simulate"]


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


def bubble_formula(schedule_name: str, stages: int, microbatches: int, virtual: int = 1) -> float:
    """The textbook bubble fraction for equal stage times (ZB-H1: and F = B = W)."""
    s, m, v = stages, microbatches, virtual
    if schedule_name in ("gpipe", "1f1b"):
        return (s - 1) / (m + s - 1)
    if schedule_name == "interleaved-1f1b":
        return (s - 1) / (v * m + s - 1)
    if schedule_name == "zb-h1":
        return (s - 1) / (3 * m + s - 1)
    raise ScheduleError(
        f"no bubble formula for schedule {schedule_name!r}; "
        "use one of gpipe, 1f1b, interleaved-1f1b, zb-h1"
    )


def _check_inputs(
    schedule: Schedule, costs: Sequence[StageCost], comm_s: Sequence[float], stages: int | None
) -> tuple[int, tuple[float, ...]]:
    ranks = stages if stages is not None else max(schedule, default=-1) + 1
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
    validate(schedule, ranks, max(mbs) + 1, n // ranks)
    return ranks, comm


def simulate(
    schedule: Schedule,
    costs: Sequence[StageCost],
    comm_s: Sequence[float] = (),
    *,
    stages: int | None = None,
) -> Timeline:
    """Simulate ``schedule`` with ``costs[j]`` per virtual stage and ``comm_s[j]`` per boundary.

    ``stages`` is the number of ranks (default: the highest rank in ``schedule`` plus one);
    ``len(costs) // stages`` is the number of virtual stages per rank and the highest
    micro-batch index plus one the number of micro-batches. The schedule is validated first
    (:func:`autopipe.schedules.validate`): an incomplete, misplaced or deadlocking schedule,
    or costs and comm_s of the wrong length, raise ScheduleError.
    """
    ranks, comm = _check_inputs(schedule, costs, comm_s, stages)
    n = len(costs)
    execution = execute_in_order(schedule, n)
    split = {
        (a.stage, a.microbatch) for acts in schedule.values() for a in acts if a and a.kind == "W"
    }

    def duration(a: Action) -> float:
        c = costs[a.stage]
        if a.kind == "F":
            return c.forward_s
        if a.kind == "W":
            return c.backward_weight_s
        return c.backward_input_s if (a.stage, a.microbatch) in split else c.backward_s

    def hop(src: int, dst: int) -> float:
        if src % ranks == dst % ranks:
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
    peak_memory, peak_inflight = _memory(schedule, costs, split, ranks)
    return Timeline(
        actions=ordered,
        iteration_s=iteration,
        bubble_fraction=bubble,
        rank_busy_s=tuple(busy),
        peak_memory_bytes=peak_memory,
        peak_inflight=peak_inflight,
    )


def _memory(
    schedule: Schedule, costs: Sequence[StageCost], split: set[tuple[int, int]], ranks: int
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Peak bytes per rank and peak in-flight micro-batches per virtual stage."""
    inflight = [0] * len(costs)
    peak_inflight = [0] * len(costs)
    peak_memory = []
    for rank in range(ranks):
        held = sum(c.static_bytes for j, c in enumerate(costs) if j % ranks == rank)
        peak = held
        for a in schedule.get(rank, []):
            if a is None:
                continue
            c = costs[a.stage]
            if a.kind == "F":
                held += c.activation_bytes
                inflight[a.stage] += 1
                peak_inflight[a.stage] = max(peak_inflight[a.stage], inflight[a.stage])
            elif a.kind == "B":
                peak = max(peak, held + c.transient_bytes)
                kept = c.weight_grad_bytes if (a.stage, a.microbatch) in split else 0.0
                held -= c.activation_bytes - kept
                inflight[a.stage] -= 1
            else:
                held -= c.weight_grad_bytes
            peak = max(peak, held)
        peak_memory.append(peak)
    return tuple(peak_memory), tuple(peak_inflight)
