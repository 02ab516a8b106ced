"""After the branch and bound: local moves of a plan's cuts on the simulated objective itself,
for decisions too large to enumerate (:func:`improve`, :func:`local_moves`), and the queue
items the search prices a split from (:class:`Split`, :class:`LazySplit`, :func:`bounded`,
:func:`refine`).

Tests: tests/planner/test_exact.py.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from autopipe.costs.profile import Profile
from autopipe.partition.baselines import BASELINES
from autopipe.partition.problem import Partition, PartitionProblem, evaluate
from autopipe.planner.bounds import PRUNE_TOLERANCE, candidate_bound, reach_bound
from autopipe.planner.pricing import BlockTimes, Candidate, Decision, Priced, candidate, fits
from autopipe.planner.request import PlanRequest
from autopipe.planner.splits import plain_may_fit, price_split, split_assignment
from autopipe.schedules import schedule_spec
from autopipe.simulate.events import Summary

__all__ = [
    "LOCAL_MOVES",
    "LOCAL_MOVE_ACTIONS",
    "LazySplit",
    "Split",
    "bounded",
    "improve",
    "local_moves",
    "order",
    "refine",
    "sizes_of",
]


def improve(
    profile: Profile,
    req: PlanRequest,
    fitting: list[Priced],
    enumerated: set[Decision],
    pending: list[tuple[float, Split | LazySplit]],
    prepared: dict[Decision, tuple[PartitionProblem, BlockTimes]],
) -> list[Priced]:
    """Local moves from each schedule's best cuts wherever they may beat the best plan.

    A schedule's start is its fastest fitting candidate on its decisions too large to
    enumerate (``fitting`` holds those the branch and bound simulated; ``pending``, by bound,
    those it left): its pending candidates are priced in bound order while the bound is below
    its fastest so far — what the search pinned to that schedule simulates too. The moves
    from it run unless :func:`~autopipe.planner.bounds.reach_bound` says no split they can reach
    beats the best plan so far; schedules are taken in the order of that bound. So the plan
    is never slower than any one searched schedule's pinned plan: the pinned search takes the
    same start and the same moves, or nothing it finds beats this plan (its branch and bound
    simulates no candidate faster than this one's best, and its moves reach no faster split)."""
    best = fitting[0][1].iteration_s
    groups: dict[str, tuple[list[Priced], list[tuple[float, Split | LazySplit]]]] = {}
    for c, t in fitting:
        if c.decision not in enumerated and c.source != "ilp":
            groups.setdefault(c.decision.schedule, ([], []))[0].append(Priced(c, t))
    for bound, split in pending:
        if split.decision not in enumerated:
            groups.setdefault(split.decision.schedule, ([], []))[1].append((bound, split))

    def reach(d: Decision, sizes: tuple[int, ...]) -> float:
        shifts = min(_budget(req, d), LOCAL_MOVES)  # moves taken at most
        return reach_bound(req, d, sizes, prepared[d][1], shifts) if shifts > 0 else math.inf

    ranked = sorted(
        (
            min(
                [reach(c.decision, sizes_of(c.partition, c.problem.stages)) for c, _ in done]
                + [reach(s.decision, s.sizes) for _, s in left]
            ),
            name,
        )
        for name, (done, left) in groups.items()
    )
    priced: list[Priced] = []
    found: list[Priced] = []
    for bound, name in ranked:
        if bound >= best * (1 - PRUNE_TOLERANCE):
            break
        done, left = groups[name]
        start = min(done, key=_rank, default=None)
        heap = [(k, i, split) for i, (k, split) in enumerate(left)]  # in bound order already
        while heap:
            k, i, split = heapq.heappop(heap)
            if start is not None and k >= start[1].iteration_s * (1 + PRUNE_TOLERANCE):
                break
            problem, times = prepared[split.decision]
            if isinstance(split, LazySplit):
                k, summed = refine(profile, req, split, problem, times)
                if k < math.inf:
                    heapq.heappush(heap, (k, i, summed))
                continue
            x = price_split(
                profile, req, split.decision, split.sizes, problem=problem, times=times, source=split.source
            )
            priced.append(x)
            if fits(x[1], req.memory_limit) and (start is None or _rank(x) < _rank(start)):
                start = x
        if start is None or reach(start[0].decision, sizes_of(start[0].partition, start[0].problem.stages)) >= best * (
            1 - PRUNE_TOLERANCE
        ):
            continue
        moved = local_moves(profile, req, *start, prepared[start[0].decision][1])
        found += moved
        best = min([best] + [t.iteration_s for _, t in moved])
    return sorted(fitting + priced + found, key=_rank)


def _rank(ct: Priced) -> tuple[float, tuple[object, ...]]:
    return ct.summary.iteration_s, order(ct.candidate)


def _budget(req: PlanRequest, d: Decision) -> int:
    """How many moves :func:`local_moves` may try on ``d``: :data:`LOCAL_MOVE_ACTIONS` over the
    actions of one simulation (F, B and W per chunk and micro-batch), and none where that is
    less than one pass over the neighbouring chunks (a large schedule adds no simulation)."""
    actions = req.devices * d.virtual * d.micro_batches * (3 if schedule_spec(d.schedule).splits_backward else 2)
    tries = LOCAL_MOVE_ACTIONS // actions
    return tries if tries >= req.devices * d.virtual - 1 else 0


@dataclass(frozen=True)
class Split:
    """A queue item: the solver's cuts or a simple split, bounded by :func:`bounded`, priced by
    ``price_split`` when the queue reaches it."""

    decision: Decision
    sizes: tuple[int, ...]
    source: str


@dataclass(frozen=True)
class LazySplit:
    """A queue item: a simple split queued by :func:`~autopipe.planner.bounds.split_bound`
    (prefix sums only), summed up and queued again as a :class:`Split` when the queue reaches
    it (:func:`refine`)."""

    decision: Decision
    sizes: tuple[int, ...]
    source: str


def bounded(
    profile: Profile, req: PlanRequest, c: Candidate, times: BlockTimes, fits_rule: bool
) -> tuple[float, Split]:
    """``c``'s cuts as a queue item, bounded as ``price_split`` will price them: nothing recomputed
    where every device may fit so (``plain_may_fit``), else c's (evaluate's rule, the solvers'
    too); inf when neither fits (``fits_rule``: c fits evaluate's rule). With recomputation off
    nothing-recomputed is the only way, and the simulated peak decides as in "auto"."""
    d, p = c.decision, c.problem
    sizes = sizes_of(c.partition, p.stages)
    plain = p.recompute != "always" and plain_may_fit(p, d, req.devices, req.memory_limit, sizes)
    if not plain and not fits_rule:
        return math.inf, Split(d, sizes, c.source)
    if plain:
        c = candidate(d, c.source, p, evaluate(p, split_assignment(sizes), (False,) * p.stages), times)
    return candidate_bound(profile, req, c), Split(d, sizes, c.source)


def refine(
    profile: Profile, req: PlanRequest, split: LazySplit, problem: PartitionProblem, times: BlockTimes
) -> tuple[float, Split]:
    """A lazy split's queue item, summed up and bounded by :func:`bounded` (inf where it fits no way)."""
    part = evaluate(problem, split_assignment(split.sizes))
    return bounded(profile, req, candidate(split.decision, split.source, problem, part, times), times, part.fits)


LOCAL_MOVES = 64
"""Improving moves at most (one block from a chunk to another) on a decision too large to enumerate."""

LOCAL_MOVE_ACTIONS = 100_000
"""Most actions the local moves simulate in all (each move simulates the whole schedule, in pure
Python: 1F1B with m = 512 on 64 devices is about 100,000 actions and 0.25 s), so a plan of
1,000 blocks on 64 devices stays within about two seconds."""


def local_moves(profile: Profile, req: PlanRequest, c: Candidate, t: Summary, times: BlockTimes) -> list[Priced]:
    """Improve the cuts of ``c`` (simulated: ``t``; its block times: ``times``) on the simulated objective itself (its
    decision had too many splits to enumerate): move one block from a chunk to another —
    neighbours first, then farther, each cut between them shifting by one — and keep the first
    move that is faster and fits; repeat until none is, for up to :data:`LOCAL_MOVES` passes
    within :data:`LOCAL_MOVE_ACTIONS`. Returns each improvement, priced."""
    d = c.decision
    budget = _budget(req, d)
    if c.source == "ilp" or budget < 1:
        return []
    K = c.problem.stages
    sizes = list(sizes_of(c.partition, K))
    moves = [(a, a + gap) for gap in range(1, K) for a in range(K - gap)]
    moves += [(b, a) for a, b in moves]  # (from chunk, to chunk)
    found = []
    for _ in range(LOCAL_MOVES):
        for src, dst in moves:
            if sizes[src] < 2 or budget < 1:
                continue
            budget -= 1
            trial = list(sizes)
            trial[src] -= 1
            trial[dst] += 1
            c2, t2 = price_split(profile, req, d, trial, problem=c.problem, times=times, source="solver")
            if fits(t2, req.memory_limit) and t2.iteration_s < t.iteration_s * (1 - PRUNE_TOLERANCE):
                sizes, c, t = trial, c2, t2
                found.append(Priced(c2, t2))
                break
        else:
            break
    return found


def order(c: Candidate) -> tuple[object, ...]:
    d = c.decision
    sources = ("solver", "ilp", *BASELINES)
    return (schedule_spec(d.schedule).preference, d.virtual, d.micro_batches, d.memory.key, sources.index(c.source))


def sizes_of(part: Partition, chunks: int) -> tuple[int, ...]:
    """Blocks per chunk of a partition."""
    count = [0] * chunks
    for j in part.stage_of_block:
        count[j] += 1
    return tuple(count)
