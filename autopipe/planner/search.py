"""The planner's search: micro-batch count x schedule x virtual stages x cuts x recompute.

For every micro-batch count ``m`` that divides the batch (micro-batch size ``u = B/m``, costs
from the Profile's affine fits), every schedule (GPipe, 1F1B, ZB-H1, interleaved 1F1B with v
virtual stages, ZB-V with two chunks per device in a V) and the per-stage recomputation choice, the partition solver
finds the cuts that minimise the pipeline's bottleneck under each device's memory limit, given how many
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

Which kernel cuts a problem, and whether the ILP places blocks freely, is one function,
:func:`choose_solvers`; an ILP solver that cannot start leaves the plan as the search has it,
with one note on the ``autopipe`` logger. What the search reuses (per micro-batch size: the
block times and partition numbers and what the kernels keep of them; the compiled schedules)
lives in the :class:`~autopipe.planner.context.SearchContext` each search makes afresh.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from autopipe.costs.activations.choices import NO_CHOICE, MemoryChoice, apply, choices
from autopipe.costs.profile import Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.modes import Recompute
from autopipe.partition.baselines import BASELINES, baseline_assignment
from autopipe.partition.chain import solve_chain
from autopipe.partition.greedy import Memo, solve_fast
from autopipe.partition.ilp import SolverUnavailable, solve_ilp
from autopipe.partition.min_memory import min_memory_limit
from autopipe.partition.problem import Partition, PartitionProblem, evaluate
from autopipe.partition.reach import cannot_fit
from autopipe.planner.bounds import (
    PRUNE_TOLERANCE,
    Work,
    decision_bound,
    layer_work,
    lower_bound,
    split_bound,
    work_table,
)
from autopipe.planner.context import SearchContext, SizeContext
from autopipe.planner.exact import SplitTable, split_table
from autopipe.planner.moves import LazySplit, Split, bounded, improve, order, refine, sizes_of
from autopipe.planner.noise import robust_plan, search_margin
from autopipe.planner.pricing import BlockTimes, Decision, Priced, candidate, fits, price
from autopipe.planner.request import (
    SEARCH_SCHEDULES,
    PlanRequest,
    decisions,
    infeasible_error,
    target_spec,
    validate,
)
from autopipe.planner.splits import device_limit, plain_may_fit, price_split, problem_of
from autopipe.plans import Plan
from autopipe.schedules import schedule_spec

__all__ = [
    "SEARCH_SCHEDULES",
    "PlanRequest",
    "Progress",
    "SharedCuts",
    "Solvers",
    "choose_solvers",
    "lower_bound",
    "plan_pipeline",
    "plan_search",
]

log = logging.getLogger("autopipe")

_EXACT_DP_LIMIT = 4_000_000  # n^2 * S above which the bisection solver replaces the DP
_ILP_MAX_BLOCKS = 48  # DAGs up to this many blocks also get the ILP's free placement
_ILP_DECISIONS = 2
_ILP_TIME_LIMIT_S = 10.0


Progress = Callable[[str, int, int], None]  # progress(what, done, total), as costs.measure.measured's


@dataclass(frozen=True)
class Solvers:
    """Which partition kernels the search runs on one problem (:func:`choose_solvers`)."""

    cuts: str  # "chain" (solve_chain, the exact DP) or "bisection" (solve_fast)
    free_placement: bool  # the ILP (solve_ilp) may then place the blocks freely


def choose_solvers(problem: PartitionProblem) -> Solvers:
    """The one place that chooses the partition kernels, by the problem's size and shape:

    - the cuts: the exact chain DP (:func:`~autopipe.partition.chain.solve_chain`) while
      n² · S is at most 4,000,000 or the stages recompute their first layers (the block
      method, which only it prices), else the bisection solver
      (:func:`~autopipe.partition.greedy.solve_fast`, within :data:`SOLVER_TOLERANCE`);
    - free placement: on a DAG (a tensor skips a block) of at most 48 blocks, the ILP
      (:func:`~autopipe.partition.ilp.solve_ilp`) also places blocks in any order monotone
      along the edges, for the best two decisions, kept where the simulator says faster.
    """
    n = problem.blocks
    if problem.recompute_layers:  # the block method: only the chain DP prices it (partition/layers.py)
        return Solvers("chain", False)
    cuts = "chain" if n * n * problem.stages <= _EXACT_DP_LIMIT else "bisection"
    dag = n <= _ILP_MAX_BLOCKS and any(t.src >= 0 and any(d != t.src + 1 for d in t.dsts) for t in problem.tensors)
    return Solvers(cuts, dag)


def plan_pipeline(profile: Profile, request: PlanRequest, progress: Progress | None = None) -> Plan:
    """The best plan for ``profile`` under ``request`` (see the module docstring);
    ``progress("searching", done, total)`` is told each decision priced of all there are.

    Best-first branch and bound: decisions are opened in the order of a lower bound on any
    plan they can give (:func:`decision_bound`), candidates simulated in the order of a
    lower bound on their own iteration time (:func:`candidate_bound`); the search stops when
    no bound left is below the best simulated plan that fits. Nothing skipped can be faster.
    Among the candidates within the profile's measured spread of the fastest, the plan is the
    one :func:`~autopipe.planner.noise.robust_order` chooses (a profile without spreads: the fastest).
    """
    validate(profile, request)
    return robust_plan(profile, request, plan_search(profile, request, progress))


def plan_search(
    profile: Profile,
    request: PlanRequest,
    progress: Progress | None = None,
    incumbent: float = math.inf,
    shared: SharedCuts | None = None,
) -> list[Priced]:
    """Every simulated candidate that fits, fastest first (the branch and bound of :func:`plan_pipeline`, for a
    validated request); InfeasibleError when none fits (none faster than ``incumbent``: another search's
    time to beat). A target that recomputes every stage or none (``Target.uniform_recompute``) searches
    both ways, where the request leaves recomputation to the search. ``shared``: the unlimited cuts
    kept across the searches of one profile (they do not depend on memory: the cluster search's
    shardings).

    Where the request leaves the memory choice to the search (``PlanRequest.memory_pin`` None), each
    uniform choice the target runs (:func:`memory_choices`: selective recomputation and offload as
    profiles, ``costs.activations.choices.apply``; the first k layers of each stage as the partition
    problem's) is searched after the plain one, against the fastest plan so far, and only on the
    decisions where memory bound the plain search (:class:`_Found`'s ``tight``): where every split
    fitted with nothing recomputed, no choice that only adds time can beat it. The block method's
    k grows while a decision stays tight.

    With a time to beat (``incumbent`` finite) an InfeasibleError says only that: its caller (the
    cluster search, ``cluster/split.py``) drops its words, so the smallest limit that would fit is
    not worked out."""
    target = target_spec(request.target)
    if request.recompute == "auto" and target.never_recomputes:
        request = replace(request, recompute=Recompute.NEVER)
    free = shared.of(profile, request) if shared is not None else None
    pin = request.memory_pin
    explain = incumbent == math.inf
    if pin is not None:
        return _raise_or(_choice_search(profile, request, pin, progress, incumbent, None, explain=explain, free=free))
    plain = _modes_search(profile, request.pinned_to(NO_CHOICE), progress, incumbent, free=free, explain=explain)
    found, errors = list(plain.priced), [plain.error]
    best = min([incumbent] + [x.summary.iteration_s for x in found])
    tight: dict[str, frozenset[tuple[str, int, int]]] = {}  # per ladder: where memory still binds
    previous: dict[str, MemoryChoice] = {}
    for choice in shared.choices(profile, request) if shared is not None else memory_choices(profile, request):
        ladder = "layers" if choice.layers else "offload" if choice.offload else "recompute"
        before = previous.get(ladder)
        only = (
            tight.get(ladder, plain.tight) if before is not None and _slower(profile, choice, before) else plain.tight
        )
        if not only:
            continue
        got = _choice_search(profile, request, choice, progress, best, only, plain, shared=shared)
        found += got.priced
        errors.append(got.error)
        best = min([best] + [x.summary.iteration_s for x in got.priced])
        tight[ladder], previous[ladder] = got.tight, choice
    if not found and not explain:
        raise InfeasibleError(f"no plan faster than {incumbent:.6g} s")
    if not found:  # nothing fits: each choice's smallest limit that would (worked out only now)
        for choice in memory_choices(profile, request):
            errors.append(_choice_search(profile, request, choice, progress, incumbent, plain.tight, plain, True).error)
        raise min((e for e in errors if e is not None), key=_need)
    return sorted(found, key=lambda ct: (ct.summary.iteration_s, order(ct.candidate)))


class SharedCuts:
    """The min-bottleneck cuts with no memory limit (``_Search.free_cuts``) of one profile and link,
    kept across searches that differ only in memory (the cluster search's shardings); and the
    memory choices each profile offers (:func:`memory_choices`) and its profile under each, kept
    across its searches on other links and limits."""

    def __init__(self) -> None:
        self._by: dict[tuple[int, float, float, float], tuple[Profile, dict[tuple[int, int], tuple[int, ...]]]] = {}
        self._choices: dict[tuple[object, ...], tuple[Profile, list[MemoryChoice]]] = {}
        self._applied: dict[tuple[object, ...], tuple[Profile, Profile]] = {}

    def applied(self, profile: Profile, choice: MemoryChoice, host_bandwidth: float) -> Profile:
        """``costs.activations.choices.apply`` of ``profile`` (this very object), once per choice."""
        key = (id(profile), "applied", choice, host_bandwidth)
        hit = self._applied.get(key)
        if hit is None or hit[0] is not profile:
            hit = self._applied[key] = (profile, apply(profile, choice, host_bandwidth))
        return hit[1]

    def choices(self, profile: Profile, req: PlanRequest) -> list[MemoryChoice]:
        """:func:`memory_choices` of ``profile`` (this very object) for ``req``, once per what it reads."""
        key = (
            id(profile),
            req.target,
            req.recompute,
            req.recompute_modules,
            req.offload_modules,
            req.recompute_layers,
            req.host_bandwidth,
            req.devices,
        )
        hit = self._choices.get(key)
        if hit is None or hit[0] is not profile:
            hit = self._choices[key] = (profile, memory_choices(profile, req))
        return list(hit[1])

    def of(self, profile: Profile, req: PlanRequest) -> dict[tuple[int, int], tuple[int, ...]]:
        """The cuts kept for ``profile`` (this very object) on ``req``'s link, per (micro-batch size, chunks)."""
        key = (id(profile), req.link_bandwidth, req.link_latency_s, req.action_overhead_s)
        hit = self._by.get(key)
        if hit is None or hit[0] is not profile:
            hit = self._by[key] = (profile, {})
        return hit[1]


def _slower(profile: Profile, choice: MemoryChoice, before: MemoryChoice) -> bool:
    """Whether ``choice`` keeps no more than ``before`` and costs every layer at least its time,
    so a decision where every split fitted under ``before`` cannot gain from it (its ladder's
    searches then keep to where ``before`` was tight): the block method's larger k, an offload
    of more kinds, a recompute set whose every layer's recomputation is no shorter."""
    if choice.layers:
        return choice.layers > before.layers
    if choice.offload:
        return set(before.offload) <= set(choice.offload)
    u = max(profile.micro_batch_sizes)
    for b in profile.blocks:
        mine = next((o for o in b.memory if o.recompute == choice.recompute), None)
        theirs = next((o for o in b.memory if o.recompute == before.recompute), None)
        if mine is None or theirs is None:
            continue
        if mine.recompute_s(u) < theirs.recompute_s(u) or mine.saved_bytes(u) > theirs.saved_bytes(u):
            return False
    return True


def _need(e: InfeasibleError) -> float:
    return e.min_memory_bytes if e.min_memory_bytes is not None else math.inf


def _raise_or(found: _Found) -> list[Priced]:
    if found.error is not None:
        raise found.error
    return found.priced


def memory_choices(profile: Profile, request: PlanRequest) -> list[MemoryChoice]:
    """The uniform memory choices the search tries for ``request`` besides none, in order:
    selective recomputation (``costs.activations.choices.choices``: those no other beats in both bytes and
    time), offload (where the device has a host link), then the first k layers of each stage for
    k = 1 up to the most layers a stage can hold, less one (all of them: ``--recompute-all``'s
    territory); each only where the target runs it, the recomputation mode allows and the
    request does not rule its form out (``recompute_modules=()`` and so on). None, unpinned, for a
    measured profile planned for autopipe's own executor, which recomputes whole stages only
    (``runtime.pipeline`` refuses the rest): such a plan is for ``autopipe run`` on the hardware
    measured, and a choice it cannot run would only be refused there (pin one to see its price)."""
    target = target_spec(request.target)
    if request.recompute == "always" or (profile.method == "measured" and target.name == "autopipe"):
        return []
    u = max(profile.micro_batch_sizes)
    out = [
        c
        for c in choices(profile, u, request.host_bandwidth)
        if (c.offload and target.offloads(c.offload) and request.offload_modules is None)
        or (c.recompute and target.recomputes(c.recompute) and request.recompute_modules is None)
    ]
    if request.recompute == "never":
        return [c for c in out if c.offload]
    layers = sum(b.layer for b in profile.blocks)
    if target.block_layers and layers > 1 and request.recompute_layers is None:
        out += [MemoryChoice(layers=k) for k in block_ladder(-(-layers // request.devices) - 1)]
    return out


def block_ladder(most: int) -> list[int]:
    """The block method's k the free search tries, up to ``most``: every k to 4, then about
    a third more each step (1, 2, 3, 4, 5, 7, 9, 12, 16, 21, ...; ``most`` always). Each k is a
    whole search on the decisions memory still binds, so trying every k of a 96-layer model's
    two-stage split cost 47 searches per layout (three quarters of GPT-3 175B's planning time);
    a k between two tried ones recomputes at most a quarter fewer layers than the larger.
    ``--recompute-layers K`` pins any k."""
    ks: list[int] = []
    k = 1
    while k <= most:
        ks.append(k)
        k = k + 1 if k < 4 else max(k + 1, round(k * 4 / 3))
    if ks and ks[-1] != most:
        ks.append(most)
    return ks


@dataclass(frozen=True)
class _Found:
    """What one search found: the candidates that fit (fastest first), the error where none did,
    the decisions (schedule, v, m) where memory bound it (:attr:`_Search.tight`) and its
    unlimited cuts (``_Search.free``: the choices' searches start from them too)."""

    priced: list[Priced]
    error: InfeasibleError | None
    tight: frozenset[tuple[str, int, int]]
    free: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict, compare=False)
    context: SearchContext | None = field(default=None, compare=False)  # what the choices' searches share


def _choice_search(
    profile: Profile,
    request: PlanRequest,
    choice: MemoryChoice,
    progress: Progress | None,
    incumbent: float,
    only: frozenset[tuple[str, int, int]] | None,
    plain: _Found | None = None,
    explain: bool = False,
    free: dict[tuple[int, int], tuple[int, ...]] | None = None,
    shared: SharedCuts | None = None,
) -> _Found:
    """The search with the memory choice ``choice`` pinned: none searches the recompute modes; any
    other is one search with nothing recomputed whole, on its profile (``costs.activations.choices.apply``).
    ``plain``: the plain search, whose unlimited cuts (candidates under any choice) and context
    (compiled schedules, and the block numbers where the profile is the same) it starts from;
    ``explain``: work out the smallest limit that fits where nothing does (else left out)."""
    if choice.none:
        return _modes_search(profile, request.pinned_to(choice), progress, incumbent, only, free, explain)
    priced = (
        shared.applied(profile, choice, request.host_bandwidth)
        if shared is not None
        else apply(profile, choice, request.host_bandwidth)
    )
    pinned = replace(request.pinned_to(choice), recompute=Recompute.NEVER)
    ctx = plain.context.sharing(priced, pinned) if plain is not None and plain.context is not None else None
    if plain is not None:
        free = dict(plain.free)
    elif free is not None:
        free = dict(free)  # the profile's unlimited cuts: candidates under any choice
    return _one_search(priced, pinned, progress, incumbent, only, free, ctx, explain)


def _modes_search(
    profile: Profile,
    request: PlanRequest,
    progress: Progress | None,
    incumbent: float,
    only: frozenset[tuple[str, int, int]] | None = None,
    free: dict[tuple[int, int], tuple[int, ...]] | None = None,
    explain: bool = True,
) -> _Found:
    """The search in the request's recompute mode; for a target that recomputes every stage or
    none, nothing recomputed and every stage recomputed, each searched, merged fastest first
    (the error, where neither fits: recomputing everything's, the least memory). ``free``: the
    unlimited cuts to start from (and keep what they find in); ``explain``: as :meth:`_Search.fitting`."""
    if not (request.recompute == "auto" and target_spec(request.target).uniform_recompute):
        return _one_search(profile, request, progress, incumbent, only, free, explain=explain)
    never = _one_search(
        profile, replace(request, recompute=Recompute.NEVER), progress, incumbent, only, free, explain=explain
    )
    always = _one_search(  # its own cuts
        profile, replace(request, recompute=Recompute.ALWAYS), progress, incumbent, only, explain=explain
    )
    found = sorted(never.priced + always.priced, key=lambda ct: (ct.summary.iteration_s, order(ct.candidate)))
    return _Found(found, None if found else always.error or never.error, never.tight, never.free, never.context)


def _one_search(
    profile: Profile,
    request: PlanRequest,
    progress: Progress | None = None,
    incumbent: float = math.inf,
    only: frozenset[tuple[str, int, int]] | None = None,
    free: dict[tuple[int, int], tuple[int, ...]] | None = None,
    ctx: SearchContext | None = None,
    explain: bool = True,
) -> _Found:
    """:func:`plan_search` for one recompute mode and memory choice (``only``: these decisions;
    ``free``: unlimited cuts to start from, as :meth:`_Search.free_cuts` keeps them; ``ctx``: a
    context shared with another search; ``explain``: as :meth:`_Search.fitting`)."""
    report = progress or (lambda what, done, total: None)
    ctx = SearchContext(profile, request) if ctx is None else ctx
    search = _Search(ctx, report, incumbent, only, free, explain)
    search.run()
    try:
        fitting = search.fitting(explain)
    except InfeasibleError as e:
        return _Found([], e, frozenset(search.tight), search.free, ctx)
    search.report("searching", len(search.todo), len(search.todo))  # the rest could not win
    fitting = _refine_with_ilp(profile, request, fitting, search.report)
    pending = [(bound, item) for bound, _, item in sorted(search.queue) if isinstance(item, Split | LazySplit)]
    found = improve(profile, request, fitting, set(search.tables), pending, search.prepared)
    return _Found(found, None, frozenset(search.tight), search.free, ctx)


@dataclass(frozen=True)
class TableRow:
    """A queue item: split ``index`` (in bound order) of an enumerated decision's table."""

    decision: Decision
    index: int


QueueItem = Split | LazySplit | TableRow
"""What the search's queue holds, each with a lower bound: the solver's cuts or a simple split
to price (:class:`Split`), a simple split to sum up first (:class:`LazySplit`), or the next
split of an enumerated decision (:class:`TableRow`)."""


class _Search:
    """The branch and bound's state: the decisions in bound order, the queue, what each opened
    decision keeps, and the best simulated time that fits."""

    def __init__(
        self,
        ctx: SearchContext,
        report: Progress,
        incumbent: float,
        only: frozenset[tuple[str, int, int]] | None = None,
        free: dict[tuple[int, int], tuple[int, ...]] | None = None,
        explain: bool = True,
    ) -> None:
        self.ctx, self.report, self.best = ctx, report, incumbent
        self.explain = explain  # work out the smallest limit that fits, for the error where none does
        self.profile, self.req = ctx.profile, ctx.request
        self.work: Work = work_table(self.profile, self.req.devices)
        self.layers = layer_work(self.profile)  # the block method's share of the bound
        bounded = sorted(
            ((decision_bound(self.work, self.req, d, self.layers), _order_key(d), i), d)
            for i, d in enumerate(decisions(self.profile, self.req))
            if only is None or _plain(d) in only
        )
        self.todo = [d for _, d in bounded]
        self.todo_bounds = [key[0] for key, _ in bounded]  # each decision's bound, in the same order
        # the opened decisions where memory bound (plan_search): a split left out or recomputed, or
        # the unlimited cuts (their sizes per decision) did not fit with nothing recomputed
        self.tight: set[tuple[str, int, int]] = set()
        self.free_sizes: dict[Decision, tuple[int, ...]] = {}
        self.simulated: list[Priced] = []
        self.queue: list[tuple[float, int, QueueItem]] = []  # (bound, tie-break, item)
        self.counter = itertools.count()
        self.need = math.inf  # the smallest limit an enumerated decision fits (for the error)
        self.infeasible: dict[tuple[str, int], tuple[int, PartitionProblem]] = {}
        self.opened = 0
        self.prepared: dict[Decision, tuple[PartitionProblem, BlockTimes]] = {}
        self.tables: dict[Decision, tuple[PartitionProblem, BlockTimes, SplitTable]] = {}
        # unlimited cuts per (micro-batch size, chunks)
        self.free: dict[tuple[int, int], tuple[int, ...]] = {} if free is None else free
        self.simple: dict[
            tuple[str, int, int], tuple[int, ...]
        ] = {}  # the simple splits' sizes per (name, micro-batch size, chunks)
        self.params = tuple(float(b.params) for b in self.profile.blocks)
        # Past the best plan by the profile's measured spread: the candidates tied with it are simulated too.
        noise = 1 + search_margin(self.profile)  # simulate past the best by the profile's spread
        self.margin = noise * (1 + PRUNE_TOLERANCE)

    def push(self, bound: float, item: QueueItem) -> None:
        heapq.heappush(self.queue, (bound, next(self.counter), item))

    def run(self) -> None:
        """Pop the queue while its least bound is below the next decision's, else open that
        decision; stop when neither bound can beat the best plan that fits."""
        self.report("searching", 0, len(self.todo))
        while True:
            open_bound = self.todo_bounds[self.opened] if self.opened < len(self.todo) else math.inf
            if self.queue and self.queue[0][0] <= open_bound:
                bound, _, item = heapq.heappop(self.queue)
                if bound >= self.best * self.margin:
                    return
                self.take(item)
                continue
            if open_bound >= self.best * self.margin or self.opened >= len(self.todo):
                return
            decision = self.todo[self.opened]
            self.opened += 1
            self.report("searching", self.opened, len(self.todo))
            self.open(decision)

    def take(self, item: QueueItem) -> None:
        """Price the item the queue gave (a lazy split: bound it from its sums, queue it again)."""
        req = self.req
        match item:
            case LazySplit():
                problem, times = self.prepared[item.decision]
                bound, split = refine(self.profile, req, item, problem, times)
                if bound < math.inf:
                    self.push(bound, split)
                return
            case Split():  # the solver's cuts or a simple split, priced as --balance prices it
                problem, times = self.prepared[item.decision]
                x = price_split(
                    self.profile, req, item.decision, item.sizes, problem=problem, times=times, source=item.source
                )
            case TableRow(decision=d, index=i):  # the next split of an enumerated decision, in bound order
                problem, times, table = self.tables[d]
                x = price_split(
                    self.profile, req, d, table.sizes[i].tolist(), problem=problem, times=times, source="solver"
                )
                if i + 1 < len(table.sizes):
                    self.push(float(table.bounds[i + 1]), TableRow(d, i + 1))
        self.simulated.append(x)
        if fits(x.summary, req.memory_limit):
            self.best = min(self.best, x.summary.iteration_s)
        d = x.candidate.decision
        if self.free_sizes.get(d) == sizes_of(x.candidate.partition, x.candidate.problem.stages):
            # the unlimited cuts as simulated: memory binds d unless they fit with nothing recomputed
            plain = fits(x.summary, req.memory_limit) and not any(x.candidate.partition.recompute)
            (self.tight.discard if plain else self.tight.add)(_plain(d))

    def open(self, decision: Decision) -> None:
        """Queue a decision's candidates: all its splits in bound order where few enough,
        else the unlimited cuts (where the chunk rule says no), the solver's and the simple splits."""
        req, size = self.req, self.ctx.size(decision)
        problem = problem_of(self.profile, req, decision, size.numbers)
        times = size.times
        enumerated = split_table(problem, times, decision, req.devices, req.memory_limit, self.explain)
        if enumerated is not None:
            self.need = min(self.need, enumerated.need)
            if enumerated.tight:
                self.tight.add(_plain(decision))
            if len(enumerated.sizes):  # few enough splits: all that fit, in bound order
                self.tables[decision] = (problem, times, enumerated)
                self.push(float(enumerated.bounds[0]), TableRow(decision, 0))
            else:
                self.infeasible_at(decision, problem)
            return
        self.prepared[decision] = (problem, times)
        if cannot_fit(problem):  # what the solver would prove at length (partition/reach.py)
            self.open_infeasible(decision, problem, size)
            return
        free = self.free_cuts(problem, size.u)
        if free is None or not free.fits:
            self.tight.add(_plain(decision))  # until the unlimited cuts, simulated, say otherwise (take)
        if free is not None:
            self.free_sizes[decision] = sizes_of(free, problem.stages)
        if free is not None and not free.fits:  # the chunk rule says no, the simulated peak may say yes
            bound, split = bounded(self.profile, req, candidate(decision, "solver", problem, free, times), times, False)
            if bound < math.inf:
                self.push(bound, split)
        self.open_solver(decision, problem, size, free)

    def open_solver(
        self, decision: Decision, problem: PartitionProblem, size: SizeContext, free: Partition | None
    ) -> None:
        """Queue the solver's cuts of ``decision`` (``free``: the unlimited cuts, when they fit its
        rule) and its simple splits: each decision's candidates are the same whatever the search
        has found so far (so the local moves start where the search pinned to its schedule does)."""
        times, u = size.times, size.u
        try:
            solved = free if free is not None and free.fits else _solve(problem, size.reach)
        except InfeasibleError:
            self.infeasible_at(decision, problem)
            return
        bound, split = bounded(
            self.profile, self.req, candidate(decision, "solver", problem, solved, times), times, True
        )
        self.push(bound, split)  # the solver's cuts fit its own rule: bound < inf
        mine = sizes_of(solved, problem.stages)
        for name in BASELINES:  # summed up when the queue reaches them (split_bound: prefix sums only)
            key = (name, u if name == "greedy-time" else 0, problem.stages)  # only greedy-time depends on the times
            if key not in self.simple:
                assignment = baseline_assignment(name, self.params, problem.time_s, problem.stages)
                self.simple[key] = tuple(int(x) for x in np.bincount(assignment, minlength=problem.stages))
            sizes = self.simple[key]
            if sizes != mine:
                self.push(split_bound(self.req, decision, problem, times, sizes), LazySplit(decision, sizes, name))

    def open_infeasible(self, decision: Decision, problem: PartitionProblem, size: SizeContext) -> None:
        """What :meth:`open` does where no split fits the chunk rule (``cannot_fit``), without
        pricing the unlimited cuts or running the solver: memory binds; the unlimited cuts are
        queued only where the simulated peak may still fit them (as :func:`bounded` screens
        them); the solver's InfeasibleError is the decision's end."""
        self.tight.add(_plain(decision))
        cuts = self.free_assignment(problem, size.u)
        if cuts is not None:
            sizes = tuple(int(x) for x in np.bincount(cuts, minlength=problem.stages))
            self.free_sizes[decision] = sizes
            if plain_may_fit(problem, decision, self.req.devices, self.req.memory_limit, sizes):
                free = evaluate(problem, cuts, (False,) * problem.stages)
                c = candidate(decision, "solver", problem, free, size.times)
                bound, split = bounded(self.profile, self.req, c, size.times, False)
                if bound < math.inf:
                    self.push(bound, split)
        self.infeasible_at(decision, problem)

    def free_assignment(self, problem: PartitionProblem, u: int) -> tuple[int, ...] | None:
        """The stage of each block in the min-bottleneck cuts of ``problem``'s blocks with no
        memory limit, nothing recomputed (solved once per micro-batch size ``u`` and chunk count:
        decisions that share both share them); None where the request recomputes every chunk."""
        K = problem.stages
        if problem.recompute == "always":
            return None
        if (u, K) not in self.free:
            free = replace(problem, inflight=(1.0,) * K, stage_memory_limit=(math.inf,) * K, recompute="never")
            self.free[u, K] = _solve(free).stage_of_block
        return self.free[u, K]

    def free_cuts(self, problem: PartitionProblem, u: int) -> Partition | None:
        """The unlimited cuts (:meth:`free_assignment`) priced under ``problem``. Where they fit,
        they are the solver's answer too (a memory limit or recomputation only raises the
        bottleneck)."""
        cuts = self.free_assignment(problem, u)
        return None if cuts is None else evaluate(problem, cuts, (False,) * problem.stages)

    def infeasible_at(self, decision: Decision, problem: PartitionProblem) -> None:
        """Keep the most micro-batches per schedule: the least memory, for the error."""
        key = (decision.schedule, decision.virtual)
        if decision.micro_batches > self.infeasible.get(key, (0, problem))[0]:
            self.infeasible[key] = (decision.micro_batches, problem)

    def fitting(self, explain: bool = True) -> list[Priced]:
        """The simulated candidates that fit, fastest first; InfeasibleError (with the smallest
        limit that would fit, unless ``explain`` is False) when none does."""
        req = self.req
        if not self.simulated and not explain:
            raise InfeasibleError("nothing fits")
        if not self.simulated:
            smallest_fit = self.need
            for (_, v), (_, problem) in self.infeasible.items():
                smallest_fit = min(smallest_fit, device_limit(min_memory_limit(problem), v))
            raise infeasible_error(self.profile, req, smallest_fit)
        fitting = [x for x in self.simulated if fits(x.summary, req.memory_limit)]
        if not fitting:
            raise infeasible_error(
                self.profile, req, min(self.need, min(max(t.peak_memory_bytes) for _, t in self.simulated))
            )
        fitting.sort(key=lambda ct: (ct.summary.iteration_s, order(ct.candidate)))
        return fitting


def _order_key(d: Decision) -> tuple[int, int, int]:
    return (schedule_spec(d.schedule).preference, d.virtual, d.micro_batches)


def _plain(d: Decision) -> tuple[str, int, int]:
    """A decision without its memory choice: what the choices' searches are limited to."""
    return (d.schedule, d.virtual, d.micro_batches)


def _refine_with_ilp(profile: Profile, req: PlanRequest, fitting: list[Priced], report: Progress) -> list[Priced]:
    """Where :func:`choose_solvers` says so (a small DAG: skip connections), let the ILP place
    blocks freely — any assignment monotone along the edges, not only contiguous ranges of one
    topological order — for the best decisions, and keep its partition where the simulator
    says it is faster. An ILP solver that cannot start leaves the plans as they are (one note)."""
    if not choose_solvers(fitting[0].candidate.problem).free_placement:
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
        except SolverUnavailable as e:
            log.warning("%s; the plan keeps the contiguous cuts the search found", e)
            break
        except (InfeasibleError, PlanError):
            continue
        if part.stage_of_block != c.partition.stage_of_block:
            cand = candidate(c.decision, "ilp", c.problem, part, c.times)
            t = price(cand, req.devices)
            if fits(t, req.memory_limit):
                extra.append(Priced(cand, t))
    return sorted(fitting + extra, key=lambda ct: (ct.summary.iteration_s, order(ct.candidate)))


SOLVER_TOLERANCE = 1e-6
"""The bisection solver's cuts are a candidate the simulator prices, not the plan: their
bottleneck within this (relative) of the least, in half the probes."""


def _solve(problem: PartitionProblem, memo: Memo | None = None) -> Partition:
    """The solver's cuts (the kernel :func:`choose_solvers` names; ``memo``: the bisection's
    memory reach kept across the decisions at one micro-batch size)."""
    if choose_solvers(problem).cuts == "chain":
        return solve_chain(problem, explain=False)
    return solve_fast(problem, explain=False, tolerance=SOLVER_TOLERANCE, memo=memo)
