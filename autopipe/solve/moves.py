"""After the branch and bound: local moves of a plan's cuts on the simulated objective itself,
for decisions too large to enumerate (:func:`improve`, :func:`local_moves`), and the queue
item the search prices a split from (:class:`Split`)."""

from __future__ import annotations

from dataclasses import dataclass

from autopipe.costs.profile import Profile
from autopipe.schedules import schedule_spec
from autopipe.schedules.simulate import Summary
from autopipe.solve.baselines import BASELINES
from autopipe.solve.bounds import PRUNE_TOLERANCE
from autopipe.solve.pricing import BlockTimes, Candidate, Decision, compiled, fits
from autopipe.solve.problem import Partition, PartitionProblem
from autopipe.solve.request import PlanRequest
from autopipe.solve.splits import price_split

__all__ = ["LOCAL_DECISIONS", "LOCAL_MOVES", "LOCAL_MOVE_ACTIONS", "LOCAL_SLACK", "Split", "improve", "local_moves", "order", "sizes_of"]


LOCAL_DECISIONS = 4
"""Schedules whose best cuts (simulated, or by bound when the branch and bound left them
unsimulated) the local moves start from."""

LOCAL_SLACK = 0.1
"""... when within this (relative) of the best plan: a schedule's cuts gain up to about this much
from the moves, so one a little slower than the best may win after them."""


def improve(
    profile: Profile,
    req: PlanRequest,
    fitting: list[tuple[Candidate, Summary]],
    enumerated: set[Decision],
    pending: list[tuple[float, Split]],
    prepared: dict[Decision, tuple[PartitionProblem, BlockTimes]],
) -> list[tuple[Candidate, Summary]]:
    """Local moves from the best cuts of each of the fastest :data:`LOCAL_DECISIONS` schedules
    (within :data:`LOCAL_SLACK` of the best) whose decision was too large to enumerate — a
    schedule whose solver cuts the branch and bound left unsimulated (``pending``, by bound)
    is priced first when its bound is within the slack — so the search's plan is less often
    behind what pinning one of those schedules finds by the same moves. Each start may
    simulate :data:`LOCAL_MOVE_ACTIONS` actions; a start after the first is taken only where
    that is one pass over its neighbouring chunks (so a large schedule adds no simulation)."""
    limit = fitting[0][1].iteration_s * (1 + LOCAL_SLACK)
    options: list[tuple[float, int, tuple[Candidate, Summary] | Split]] = []  # (time or bound, tie-break, start)
    seen: set[str] = set()
    for c, t in fitting:  # each schedule's best simulated cuts
        if c.decision.schedule not in seen:
            seen.add(c.decision.schedule)
            options.append((t.iteration_s, len(options), (c, t)))
    options += [(bound, len(options) + i, item) for i, (bound, item) in enumerate(pending)]
    options.sort(key=lambda x: x[:2])
    starts: list[tuple[Candidate, Summary]] = []
    priced: list[tuple[Candidate, Summary]] = []
    for k, _, start in options:
        if len(starts) == LOCAL_DECISIONS or k > limit:
            break
        d = start.decision if isinstance(start, Split) else start[0].decision
        if any(c.decision.schedule == d.schedule for c, _ in starts) or d in enumerated:
            continue
        if starts and LOCAL_MOVE_ACTIONS // _actions(req, d) < req.devices * d.virtual - 1:
            continue  # too few moves for one pass over its neighbouring chunks
        if isinstance(start, Split):
            problem, times = prepared[d]
            start = price_split(profile, req, d, start.sizes, problem=problem, times=times, source="solver")
            if not fits(start[1], req.memory_limit):
                continue
            priced.append(start)
        starts.append(start)
    found = [x for c, t in starts for x in local_moves(profile, req, c, t)]
    return sorted(fitting + priced + found, key=lambda ct: (ct[1].iteration_s, order(ct[0])))


def _actions(req: PlanRequest, d: Decision) -> int:
    """About how many actions one simulation of ``d`` takes (F, B and W per chunk and micro-batch)."""
    return req.devices * d.virtual * d.micro_batches * (3 if schedule_spec(d.schedule).splits_backward else 2)


@dataclass(frozen=True)
class Split:
    """The solver's cuts or a simple split, priced by ``price_split`` when the queue reaches it."""

    decision: Decision
    sizes: tuple[int, ...]
    source: str


LOCAL_MOVES = 64
"""Improving moves at most (one block from a chunk to another) on a decision too large to enumerate."""

LOCAL_MOVE_ACTIONS = 100_000
"""Most actions the local moves simulate in all (each move simulates the whole schedule, in pure
Python: 1F1B with m = 512 on 64 devices is about 100,000 actions and 0.25 s), so a plan of
1,000 blocks on 64 devices stays within about two seconds."""


def local_moves(profile: Profile, req: PlanRequest, c: Candidate, t: Summary) -> list[tuple[Candidate, Summary]]:
    """Improve the cuts of ``c`` (simulated: ``t``) on the simulated objective itself (its
    decision had too many splits to enumerate): move one block from a chunk to another —
    neighbours first, then farther, each cut between them shifting by one — and keep the first
    move that is faster and fits; repeat until none is, for up to :data:`LOCAL_MOVES` passes
    within :data:`LOCAL_MOVE_ACTIONS`. Returns each improvement, priced."""
    d = c.decision
    budget = LOCAL_MOVE_ACTIONS // len(compiled(d.schedule, req.devices, d.micro_batches, d.virtual).rank)
    if c.source == "ilp" or budget < 1:
        return []
    K = c.problem.stages
    sizes = list(sizes_of(c.partition, K))
    times = BlockTimes.of(profile, req.batch_size // d.micro_batches, req.action_overhead_s)
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
                found.append((c2, t2))
                break
        else:
            break
    return found


def order(c: Candidate) -> tuple[int, int, int, int]:
    d = c.decision
    sources = ("solver", "ilp", *BASELINES)
    return (schedule_spec(d.schedule).preference, d.virtual, d.micro_batches, sources.index(c.source))


def sizes_of(part: Partition, chunks: int) -> tuple[int, ...]:
    """Blocks per chunk of a partition."""
    count = [0] * chunks
    for j in part.stage_of_block:
        count[j] += 1
    return tuple(count)
