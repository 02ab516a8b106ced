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
splits (C(n-1, S·v-1); every small model), :mod:`autopipe.planner.exact` prices all of them at
once — each device's peak memory exactly (it depends on the order of actions only), and a
lower bound on the simulated time — and the search simulates the splits that fit in bound
order with :func:`~autopipe.planner.splits.price_split`, the function ``--balance`` prices a
user's split with. Decisions are a best-first branch and bound too: opened in the order of a
lower bound on any plan they can give, and the search stops when no bound left is below the
best plan that fits. So the plan is the best contiguous split of its decision set under the
simulator (ties to the preferred schedule). On larger decisions the candidates are the chain
solver's min-bottleneck cuts, the min-bottleneck cuts with no memory limit (solved once per
micro-batch size and chunk count, shared by every schedule; where the simulated peak fits
without recomputation they are the least bottleneck of all) and three simple splits (even by
layers, balanced by parameters, greedy by time, also reported as baselines; ``assemble.py``),
each priced by ``price_split`` too (so nothing is recomputed where every device fits without);
then each schedule's best cuts are improved a block at a time (from one chunk to another) while
the simulator says they get faster, wherever a bound says that may beat the plan
(:mod:`autopipe.planner.moves`; the plan's gap to :func:`lower_bound` is what
``bench/bench_planner.py`` reports). Each decision's candidates are the same whatever the
search has found, so the plan is never slower than any one searched schedule's plan pinned. Placement is the
schedule's own (``ScheduleSpec.placement``: round-robin, V); nothing here assumes either. On
small models with skip connections the ILP may then place blocks freely (not only in
contiguous ranges).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from autopipe.costs.profile import Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.partition.baselines import BASELINES, baseline_assignment
from autopipe.partition.chain import solve_chain
from autopipe.partition.greedy import Memo, solve_fast
from autopipe.partition.ilp import solve_ilp
from autopipe.partition.min_memory import min_memory_limit
from autopipe.partition.problem import Partition, PartitionProblem, evaluate
from autopipe.planner.assemble import make_plan
from autopipe.planner.bounds import (
    PRUNE_TOLERANCE,
    decision_bound,
    lower_bound,
    split_bound,
    work_table,
)
from autopipe.planner.exact import SplitTable, split_table
from autopipe.planner.moves import Split, bounded, improve, order, refine, sizes_of
from autopipe.planner.pricing import BlockTimes, Candidate, Decision, candidate, fits, price
from autopipe.planner.request import (
    SEARCH_SCHEDULES,
    PlanRequest,
    decisions,
    infeasible_error,
    validate,
)
from autopipe.planner.splits import price_split, problem_of
from autopipe.plans import Plan
from autopipe.schedules import schedule_spec
from autopipe.simulate.events import Summary

__all__ = ["SEARCH_SCHEDULES", "PlanRequest", "Progress", "lower_bound", "plan_pipeline", "plan_search"]

_EXACT_DP_LIMIT = 4_000_000  # n^2 * S above which the bisection solver replaces the DP
_ILP_MAX_BLOCKS = 48  # DAGs up to this many blocks also get the ILP's free placement
_ILP_DECISIONS = 2
_ILP_TIME_LIMIT_S = 10.0


Progress = Callable[[str, int, int], None]  # progress(what, done, total), as costs.measured's


def plan_pipeline(profile: Profile, request: PlanRequest, progress: Progress | None = None) -> Plan:
    """The best plan for ``profile`` under ``request`` (see the module docstring);
    ``progress("searching", done, total)`` is told each decision priced of all there are.

    Best-first branch and bound: decisions are opened in the order of a lower bound on any
    plan they can give (:func:`decision_bound`), candidates simulated in the order of a
    lower bound on their own iteration time (:func:`candidate_bound`); the search stops when
    no bound left is below the best simulated plan that fits. Nothing skipped can be faster.
    """
    validate(profile, request)
    fitting = plan_search(profile, request, progress)
    best_candidate, timeline = fitting[0]
    return make_plan(profile, request, best_candidate, timeline, fitting)


def plan_search(profile: Profile, request: PlanRequest, progress: Progress | None = None, incumbent: float = math.inf) -> list[tuple[Candidate, Summary]]:
    """Every simulated candidate that fits, fastest first (the branch and bound of :func:`plan_pipeline`, for a
    validated request); InfeasibleError when none fits (none faster than ``incumbent``: another search's time to beat)."""
    work = work_table(profile, request.devices)
    todo = sorted(
        decisions(profile, request),
        key=lambda d: (decision_bound(work, request, d), _order_key(d)),
    )
    simulated: list[tuple[Candidate, Summary]] = []
    queue: list[tuple[float, int, Split | tuple[Decision, int]]] = []  # (bound, tie-break, split or enumerated split)
    best = incumbent
    need = math.inf  # the smallest limit an enumerated decision fits (for the error)
    infeasible: dict[tuple[str, int], tuple[int, PartitionProblem]] = {}
    next_decision = 0
    counter = itertools.count()
    prepared: dict[Decision, tuple[PartitionProblem, BlockTimes]] = {}
    tables: dict[Decision, tuple[PartitionProblem, BlockTimes, SplitTable]] = {}
    shared: Shared = {}  # unlimited cuts per (micro-batch size, chunks)
    memos: dict[int, Memo] = {}  # the bisection solver's memory reach per micro-batch size
    simple: dict[tuple[str, int, int], tuple[int, ...]] = {}  # the simple splits' sizes per (name, micro-batch size, chunks)
    params = _params(profile)
    report = progress or (lambda what, done, total: None)

    def infeasible_at(decision: Decision, problem: PartitionProblem) -> None:
        # Keep the most micro-batches per schedule: the least memory, for the error.
        key = (decision.schedule, decision.virtual)
        if decision.micro_batches > infeasible.get(key, (0, problem))[0]:
            infeasible[key] = (decision.micro_batches, problem)

    def open_solver(decision: Decision, problem: PartitionProblem, times: BlockTimes, free: Partition | None) -> None:
        """Queue the solver's cuts of ``decision`` (``free``: the unlimited cuts, when they fit its
        rule) and its simple splits: each decision's candidates are the same whatever the search
        has found so far (so the local moves start where the search pinned to its schedule does)."""
        try:
            u = request.batch_size // decision.micro_batches
            solved = free if free is not None and free.fits else _solve(problem, memos.setdefault(u, Memo()))
        except InfeasibleError:
            infeasible_at(decision, problem)
            return
        bound, split = bounded(profile, request, candidate(decision, "solver", problem, solved, times), times, True)
        heapq.heappush(queue, (bound, next(counter), split))  # the solver's cuts fit its own rule: bound < inf
        mine = sizes_of(solved, problem.stages)
        for name in BASELINES:  # summed up when the queue reaches them (split_bound: prefix sums only)
            key = (name, u if name == "greedy-time" else 0, problem.stages)  # only greedy-time depends on the times
            if key not in simple:
                assignment = baseline_assignment(name, params, problem.time_s, problem.stages)
                simple[key] = tuple(int(x) for x in np.bincount(assignment, minlength=problem.stages))
            sizes = simple[key]
            if sizes != mine:
                bound = split_bound(request, decision, problem, times, sizes)
                heapq.heappush(queue, (bound, next(counter), Split(decision, sizes, name, lazy=True)))

    report("searching", 0, len(todo))
    while True:
        open_bound = decision_bound(work, request, todo[next_decision]) if next_decision < len(todo) else math.inf
        if queue and queue[0][0] <= open_bound:
            bound, _, item = heapq.heappop(queue)
            if bound >= best * (1 + PRUNE_TOLERANCE):
                break
            if isinstance(item, Split) and item.lazy:  # a simple split: its bound from its sums, queued again
                problem, times = prepared[item.decision]
                bound, split = refine(profile, request, item, problem, times)
                if bound < math.inf:
                    heapq.heappush(queue, (bound, next(counter), split))
                continue
            if isinstance(item, Split):  # the solver's cuts or a simple split, priced as --balance prices it
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
        if enumerated is not None:
            need = min(need, enumerated.need)
            infeasible_at(decision, problem)
            continue
        prepared[decision] = (problem, times)
        u = request.batch_size // decision.micro_batches
        free = _free_cuts(problem, shared, u)
        if free is not None and not free.fits:  # the chunk rule says no, the simulated peak may say yes
            bound, split = bounded(profile, request, candidate(decision, "solver", problem, free, times), times, False)
            if bound < math.inf:
                heapq.heappush(queue, (bound, next(counter), split))
        open_solver(decision, problem, times, free)
    if not simulated:
        smallest_fit = need
        for (_, v), (_, problem) in infeasible.items():
            smallest_fit = min(smallest_fit, min_memory_limit(problem) * v)
        raise infeasible_error(profile, request, smallest_fit)
    fitting = [(c, t) for c, t in simulated if fits(t, request.memory_limit)]
    if not fitting:
        raise infeasible_error(profile, request, min(need, min(max(t.peak_memory_bytes) for _, t in simulated)))
    fitting.sort(key=lambda ct: (ct[1].iteration_s, order(ct[0])))
    report("searching", len(todo), len(todo))  # the rest could not win
    fitting = _refine_with_ilp(profile, request, fitting, report)
    pending = [(bound, item) for bound, _, item in sorted(queue) if isinstance(item, Split)]
    return improve(profile, request, fitting, set(tables), pending, prepared)


def _order_key(d: Decision) -> tuple[int, int, int]:
    return (schedule_spec(d.schedule).preference, d.virtual, d.micro_batches)


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
    return sorted(fitting + extra, key=lambda ct: (ct[1].iteration_s, order(ct[0])))


# --------------------------------------------------------------------------- decisions


Shared = dict[tuple[int, int], tuple[int, ...]]


def _free_cuts(problem: PartitionProblem, shared: Shared, u: int) -> Partition | None:
    """The min-bottleneck cuts of ``problem``'s blocks with no memory limit, nothing recomputed
    (solved once per micro-batch size ``u`` and chunk count: decisions that share both share
    them), priced under ``problem``; None where the request recomputes every chunk. Where they
    fit, they are the solver's answer too (a memory limit or recomputation only raises the
    bottleneck)."""
    K = problem.stages
    if problem.recompute == "always":
        return None
    if (u, K) not in shared:
        free = replace(problem, inflight=(1.0,) * K, stage_memory_limit=(math.inf,) * K, recompute="never")
        shared[u, K] = _solve(free).stage_of_block
    return evaluate(problem, shared[u, K], (False,) * K)


SOLVER_TOLERANCE = 1e-6
"""The bisection solver's cuts are a candidate the simulator prices, not the plan: their
bottleneck within this (relative) of the least, in half the probes."""


def _solve(problem: PartitionProblem, memo: Memo | None = None) -> Partition:
    """The solver's cuts: the DP's on small problems, else the bisection's (``memo``: its
    memory reach kept across the decisions at one micro-batch size)."""
    n = problem.blocks
    if n * n * problem.stages <= _EXACT_DP_LIMIT:
        return solve_chain(problem, explain=False)
    return solve_fast(problem, explain=False, tolerance=SOLVER_TOLERANCE, memo=memo)


def _params(profile: Profile) -> tuple[float, ...]:
    return tuple(float(b.params) for b in profile.blocks)
