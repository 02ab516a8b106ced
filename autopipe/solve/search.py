"""The planner's search: micro-batch count x schedule x virtual stages x cuts x recompute.

For every micro-batch count ``m`` that divides the batch (micro-batch size ``u = B/m``, costs
from the Profile's affine fits), every schedule (GPipe, 1F1B, ZB-H1, interleaved 1F1B with v
virtual stages, ZB-V with two chunks per device in a V) and the per-stage recomputation choice, the partition solver finds the cuts
that minimise the pipeline's bottleneck under each device's memory limit, given how many
micro-batches of activations the schedule holds on each stage (``ScheduleSpec.inflight``, in
each schedule's module; limit M / v per chunk, a heuristic for its own cuts — the simulated
per-device peak decides what fits):

    GPipe              k_s = m
    1F1B               k_s = min(m, S - s)            (PipeDream-Flush)
    ZB-H1              k_s = min(m, S)                (W keeps inputs alive past B; conservative)
    interleaved 1F1B   k_j = (w_r + 1) / v per chunk,
                       w_r = min(2 (S - r - 1) + (v - 1) S, v m) warm-up forwards on rank r

Exact under the simulator. For a decision with at most ``exact.ENUMERATE_LIMIT`` contiguous
splits (C(n-1, S·v-1); every small model), :mod:`autopipe.solve.exact` prices all of them at
once — each device's peak memory exactly (it depends on the order of actions only), and a
lower bound on the simulated time — and the search simulates the splits that fit in bound
order with :func:`~autopipe.solve.splits.price_split`, the function ``--balance`` prices a
user's split with. Decisions are a best-first branch and bound too: opened in the order of a
lower bound on any plan they can give, and the search stops when no bound left is below the
best plan that fits. So the plan is the best contiguous split of its decision set under the
simulator (ties to the preferred schedule). On larger decisions the chain solver's
min-bottleneck cuts and three simple splits (even by layers, balanced by parameters, greedy by
time, also reported as baselines; ``assemble.py``) are the candidates, each priced by
``price_split`` too (so nothing is recomputed where every device fits without), and the winner's split
is then improved a block at a time (from one chunk to another) while the simulator says it gets
faster (``_local_moves``; its gap to :func:`lower_bound` is what ``bench/bench_planner.py``
reports). Placement is the
schedule's own (``ScheduleSpec.placement``: round-robin, V); nothing here assumes either. On
small models with skip connections the ILP may then place blocks freely (not only in
contiguous ranges).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from autopipe.costs.profile import Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.plans import Plan
from autopipe.schedules import schedule_spec
from autopipe.schedules.simulate import Summary
from autopipe.solve.assemble import make_plan
from autopipe.solve.baselines import BASELINES, baseline_assignment
from autopipe.solve.chain import solve_chain
from autopipe.solve.exact import SplitTable, split_table
from autopipe.solve.greedy import solve_fast
from autopipe.solve.ilp import solve_ilp
from autopipe.solve.min_memory import min_memory_limit
from autopipe.solve.pricing import BlockTimes, Candidate, Decision, candidate, compiled, fits, price
from autopipe.solve.problem import Partition, PartitionProblem, evaluate
from autopipe.solve.request import (
    SEARCH_SCHEDULES,
    PlanRequest,
    decisions,
    infeasible_error,
    validate,
)
from autopipe.solve.splits import plain_may_fit, price_split, problem_of, split_assignment

__all__ = ["SEARCH_SCHEDULES", "PlanRequest", "Progress", "lower_bound", "plan_pipeline", "plan_search"]

_EXACT_DP_LIMIT = 4_000_000  # n^2 * S above which the bisection solver replaces the DP
_ILP_MAX_BLOCKS = 48  # DAGs up to this many blocks also get the ILP's free placement
_ILP_DECISIONS = 2
_ILP_TIME_LIMIT_S = 10.0


PRUNE_TOLERANCE = 1e-12
"""A bound must beat the best so far by more than this (relative) to be searched: bounds and
simulated times are sums of the same floats in other orders, so exact ties differ by rounding."""


Progress = Callable[[str, int, int], None]  # progress(what, done, total), as costs.measured's


def plan_pipeline(profile: Profile, request: PlanRequest, progress: Progress | None = None) -> Plan:
    """The best plan for ``profile`` under ``request`` (see the module docstring);
    ``progress("searching", done, total)`` is told each decision priced of all there are.

    Best-first branch and bound: decisions are opened in the order of a lower bound on any
    plan they can give (:func:`_decision_bound`), candidates simulated in the order of a
    lower bound on their own iteration time (:func:`_candidate_bound`); the search stops when
    no bound left is below the best simulated plan that fits. Nothing skipped can be faster.
    """
    validate(profile, request)
    fitting = plan_search(profile, request, progress)
    best_candidate, timeline = fitting[0]
    return make_plan(profile, request, best_candidate, timeline, fitting)


def plan_search(profile: Profile, request: PlanRequest, progress: Progress | None = None, incumbent: float = math.inf) -> list[tuple[Candidate, Summary]]:
    """Every simulated candidate that fits, fastest first (the branch and bound of :func:`plan_pipeline`, for a
    validated request); InfeasibleError when none fits (none faster than ``incumbent``: another search's time to beat)."""
    work = _work_table(profile, request.devices)
    todo = sorted(
        decisions(profile, request),
        key=lambda d: (_decision_bound(work, request, d), _order_key(d)),
    )
    simulated: list[tuple[Candidate, Summary]] = []
    queue: list[tuple[float, int, _Split | tuple[Decision, int]]] = []  # (bound, tie-break, split or enumerated split)
    best = incumbent
    need = math.inf  # the smallest limit an enumerated decision fits (for the error)
    infeasible: dict[tuple[str, int], tuple[int, PartitionProblem]] = {}
    next_decision = 0
    counter = itertools.count()
    expand: dict[Decision, tuple[PartitionProblem, BlockTimes]] = {}
    prepared: dict[Decision, tuple[PartitionProblem, BlockTimes]] = {}
    tables: dict[Decision, tuple[PartitionProblem, BlockTimes, SplitTable]] = {}
    report = progress or (lambda what, done, total: None)
    report("searching", 0, len(todo))
    while True:
        open_bound = _decision_bound(work, request, todo[next_decision]) if next_decision < len(todo) else math.inf
        if queue and queue[0][0] <= open_bound:
            bound, _, item = heapq.heappop(queue)
            if bound >= best * (1 + PRUNE_TOLERANCE):
                break
            if isinstance(item, _Split):  # the solver's cuts or a simple split, priced as --balance prices it
                problem, times = prepared[item.decision]
                c, t = price_split(profile, request, item.decision, item.sizes, problem=problem, times=times, source=item.source)
            else:  # the next split of an enumerated decision, in bound order
                d, i = item
                problem, times, table = tables[d]
                c, t = price_split(profile, request, d, table.sizes[i].tolist(), problem=problem, times=times, source="solver")
                if i + 1 < len(table.sizes):
                    heapq.heappush(queue, (float(table.bounds[i + 1]), next(counter), (d, i + 1)))
            simulated.append((c, t))
            if fits(t, request.memory_limit):
                best = min(best, t.iteration_s)
            if c.source == "solver" and c.decision in expand:
                # The simple splits of this decision are candidates too (and so never win).
                problem, times = expand.pop(c.decision)
                for name in BASELINES:
                    part = evaluate(problem, baseline_assignment(name, _params(profile), problem.time_s, problem.stages))
                    if part.stage_of_block != c.partition.stage_of_block:
                        bound, split = _split(profile, request, candidate(c.decision, name, problem, part, times), times, part.fits)
                        if bound < math.inf:
                            heapq.heappush(queue, (bound, next(counter), split))
            continue
        if open_bound >= best * (1 + PRUNE_TOLERANCE) or next_decision >= len(todo):
            break
        decision = todo[next_decision]
        next_decision += 1
        report("searching", next_decision, len(todo))
        problem = problem_of(profile, request, decision)
        times = BlockTimes.of(profile, request.batch_size // decision.micro_batches, request.action_overhead_s)
        enumerated = split_table(problem, times, decision, request.devices, request.memory_limit)
        if enumerated is not None and len(enumerated.sizes):  # few enough splits: all that fit, in bound order
            need = min(need, enumerated.need)
            tables[decision] = (problem, times, enumerated)
            heapq.heappush(queue, (float(enumerated.bounds[0]), next(counter), (decision, 0)))
            continue
        try:
            if enumerated is not None:
                need = min(need, enumerated.need)
                raise InfeasibleError("no split fits")
            solved = _solve(problem)
        except InfeasibleError:
            # Keep the most micro-batches per schedule: the least memory, for the error.
            key = (decision.schedule, decision.virtual)
            if decision.micro_batches > infeasible.get(key, (0, problem))[0]:
                infeasible[key] = (decision.micro_batches, problem)
            continue
        bound, split = _split(profile, request, candidate(decision, "solver", problem, solved, times), times, True)
        heapq.heappush(queue, (bound, next(counter), split))  # the solver's cuts fit its own rule: bound < inf
        expand[decision] = prepared[decision] = (problem, times)
    if not simulated:
        smallest_fit = need
        for (_, v), (_, problem) in infeasible.items():
            smallest_fit = min(smallest_fit, min_memory_limit(problem) * v)
        raise infeasible_error(profile, request, smallest_fit)
    fitting = [(c, t) for c, t in simulated if fits(t, request.memory_limit)]
    if not fitting:
        raise infeasible_error(profile, request, min(need, min(max(t.peak_memory_bytes) for _, t in simulated)))
    fitting.sort(key=lambda ct: (ct[1].iteration_s, _order(ct[0])))
    report("searching", len(todo), len(todo))  # the rest could not win
    fitting = _refine_with_ilp(profile, request, fitting, report)
    if fitting[0][0].decision not in tables:
        fitting = _local_moves(profile, request, fitting)
    return fitting


@dataclass(frozen=True)
class _Split:
    """The solver's cuts or a simple split, priced by ``price_split`` when the queue reaches it."""

    decision: Decision
    sizes: tuple[int, ...]
    source: str


def _split(profile: Profile, req: PlanRequest, c: Candidate, times: BlockTimes, fits_rule: bool) -> tuple[float, _Split]:
    """``c``'s cuts as a queue item, bounded as ``price_split`` will price them: nothing recomputed
    where every device may fit so (``plain_may_fit``), else c's (evaluate's rule, the solvers'
    too); inf when neither fits (``fits_rule``: c fits evaluate's rule)."""
    d, p = c.decision, c.problem
    sizes = tuple(c.partition.stage_of_block.count(j) for j in range(p.stages))
    plain = p.recompute == "auto" and plain_may_fit(p, d, req.devices, req.memory_limit, sizes)
    if not plain and not fits_rule:
        return math.inf, _Split(d, sizes, c.source)
    if plain:
        c = candidate(d, c.source, p, evaluate(p, split_assignment(sizes), (False,) * p.stages), times)
    return _candidate_bound(profile, req, c), _Split(d, sizes, c.source)


LOCAL_MOVES = 64
"""Improving moves at most (one block from a chunk to another) on a decision too large to enumerate."""

LOCAL_MOVE_ACTIONS = 100_000
"""Most actions the local moves simulate in all (each move simulates the whole schedule, in pure
Python: 1F1B with m = 512 on 64 devices is about 100,000 actions and 0.25 s), so a plan of
1,000 blocks on 64 devices stays within about two seconds."""


def _local_moves(profile: Profile, req: PlanRequest, fitting: list[tuple[Candidate, Summary]]) -> list[tuple[Candidate, Summary]]:
    """Improve the best plan's cuts on the simulated objective itself (its decision had too
    many splits to enumerate): move one block from a chunk to another — neighbours first, then
    farther, each cut between them shifting by one — and keep the first move that is faster and
    fits; repeat until none is, for up to :data:`LOCAL_MOVES` passes within
    :data:`LOCAL_MOVE_ACTIONS`."""
    c, t = fitting[0]
    d = c.decision
    budget = LOCAL_MOVE_ACTIONS // len(compiled(d.schedule, req.devices, d.micro_batches, d.virtual).rank)
    if c.source == "ilp" or budget < 1:
        return fitting
    K = c.problem.stages
    sizes = [c.partition.stage_of_block.count(j) for j in range(K)]
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
    return sorted(fitting + found, key=lambda ct: (ct[1].iteration_s, _order(ct[0])))


def lower_bound(profile: Profile, request: PlanRequest) -> float:
    """A time no plan of ``request`` can beat (the least decision bound): the gap of a plan
    found by local moves, on decisions too large to enumerate, is measured against it."""
    work = _work_table(profile, request.devices)
    return min((_decision_bound(work, request, d) for d in decisions(profile, request)), default=math.inf)


def _order_key(d: Decision) -> tuple[int, int, int]:
    return (schedule_spec(d.schedule).preference, d.virtual, d.micro_batches)


def _candidate_bound(profile: Profile, req: PlanRequest, c: Candidate) -> float:
    """A time the simulator cannot beat for this candidate (its cuts are known now).

    For each chunk j of rank r: r's work on its chunks from j on (all m F and m B) cannot
    start before micro-batch 0's forward reaches chunk j, and after the last of those B the
    gradient still crosses every chunk before j (on a V, the up chunk waits for the way down). Every rank also works m times its
    stages' F + B + W, and micro-batch 0 makes the whole round trip.
    """
    d = c.decision
    costs = c.costs
    m, S = d.micro_batches, req.devices
    spec = schedule_spec(d.schedule)
    split = spec.splits_backward
    f = [x.forward_s for x in costs]
    b = [x.backward_input_s if split else x.backward_s for x in costs]
    w = [x.backward_weight_s if split else 0.0 for x in costs]
    placed = spec.devices_of(S, d.virtual)
    comm = [x if placed[j] != placed[j + 1] else 0.0 for j, x in enumerate(c.partition.comm_s)]  # a link only between devices
    bound = sum(f) + sum(b) + 2 * sum(comm)
    before, ahead = 0.0, 0.0  # F + B (and links) of the chunks before chunk j; F (and links) alone
    for j, r in enumerate(placed):
        later = [i for i in range(j, len(placed)) if placed[i] == r]  # r's chunks from j on
        busy = m * sum(f[i] + b[i] + w[i] for i in later)
        work = m * sum(f[i] + b[i] for i in later)
        bound = max(bound, ahead + busy, before + work)
        link = comm[j] if j < len(comm) else 0.0
        before += f[j] + b[j] + 2 * link
        ahead += f[j] + link
    return bound


def _decision_bound(work: Work, req: PlanRequest, d: Decision) -> float:
    """A time no plan of decision ``d`` can beat, whatever its cuts (so the search may skip it).

    Micro-batch 0 runs forward through every stage and back, one action after another, so
    the iteration takes at least the model's whole F + B for one micro-batch (B: the input-
    gradient part when W is split off, which the first stage does not have); and the ranks share m times the model's total work T,
    so the busiest works at least a 1/S share of it. Sharper, for one stage per rank: rank r
    cannot start before micro-batch 0's forward has crossed stages 0..r-1, then works m t_r,
    and (GPipe, 1F1B) its last gradient still crosses stages r-1..0 — at least
    ``a P_r + m t_r`` with ``P_r`` the work of the stages before r and ``a`` the smallest
    share of a block's work on that path (1 with the backward, f / (f + b) without). The
    cuts that make these equal for every r give the bound ``a T / (1 - (1 - a / m)^S)``
    (blocks cannot be cut finer, and communication and recomputation only add).
    """
    u = req.batch_size // d.micro_batches
    total, chain, share = work(u, schedule_spec(d.schedule).splits_backward)
    bound = max(chain, d.micro_batches * total / req.devices)
    if d.virtual == 1 and share > 0:
        m, S = d.micro_batches, req.devices
        x = share / m  # 1 - (1 - x)^S below, exact also where x is below float precision (huge batches)
        bound = max(bound, share * total / (1.0 if x >= 1 else -math.expm1(S * math.log1p(-x))))
    return bound


Work = Callable[[int, bool], tuple[float, float, float]]


def _work_table(profile: Profile, devices: int) -> Work:
    """``work(u, split)``: (T: every block's F + B, the chain micro-batch 0 must cross, the
    share ``a`` of :func:`_decision_bound`) at micro-batch size ``u``, computed once each."""

    @functools.cache
    def work(u: int, split: bool) -> tuple[float, float, float]:
        blocks = profile.blocks
        f = [b.forward_s(u) for b in blocks]
        t = [fi + b.backward_s(u) for fi, b in zip(f, blocks, strict=True)]
        total = sum(t)
        if not split:
            return total, total, 1.0
        # B of the first stage is empty (its inputs need no gradient); the last S - 1 blocks
        # are never on it.
        tail = blocks[len(blocks) - devices + 1 :] if devices > 1 else ()
        chain = sum(f) + sum(b.backward_input_s(u) for b in tail)
        share = min((fi / ti for fi, ti in zip(f, t, strict=True) if ti > 0), default=0.0)
        return total, chain, share

    return work


def _is_dag(profile: Profile) -> bool:
    return any(t.src >= 0 and any(d != t.src + 1 for d in t.dsts) for t in profile.tensors)


def _refine_with_ilp(
    profile: Profile, req: PlanRequest, fitting: list[tuple[Candidate, Summary]], report: Progress
) -> list[tuple[Candidate, Summary]]:
    """On a small DAG (skip connections), let the ILP place blocks freely — any assignment
    monotone along the edges, not only contiguous ranges of one topological order — for the
    best decisions, and keep its partition where the simulator says it is faster."""
    if not _is_dag(profile) or profile.num_blocks > _ILP_MAX_BLOCKS:
        return fitting
    extra = []
    tried: set[Decision] = set()
    for c, _ in fitting:
        if len(tried) == _ILP_DECISIONS:
            break
        if c.decision in tried:
            continue
        report("placing blocks freely (ILP)", len(tried), _ILP_DECISIONS)
        tried.add(c.decision)
        try:
            part = solve_ilp(c.problem, time_limit_s=_ILP_TIME_LIMIT_S)
        except (InfeasibleError, PlanError):
            continue
        if part.stage_of_block != c.partition.stage_of_block:
            times = BlockTimes.of(profile, req.batch_size // c.decision.micro_batches, req.action_overhead_s)
            cand = candidate(c.decision, "ilp", c.problem, part, times)
            t = price(cand, req.devices)
            if fits(t, req.memory_limit):
                extra.append((cand, t))
    return sorted(fitting + extra, key=lambda ct: (ct[1].iteration_s, _order(ct[0])))


# --------------------------------------------------------------------------- decisions


def _solve(problem: PartitionProblem) -> Partition:
    n = problem.blocks
    if n * n * problem.stages <= _EXACT_DP_LIMIT:
        return solve_chain(problem, explain=False)
    return solve_fast(problem, explain=False)


def _order(c: Candidate) -> tuple[int, int, int, int]:
    d = c.decision
    sources = ("solver", "ilp", *BASELINES)
    return (schedule_spec(d.schedule).preference, d.virtual, d.micro_batches, sources.index(c.source))


def _params(profile: Profile) -> tuple[float, ...]:
    return tuple(float(b.params) for b in profile.blocks)
