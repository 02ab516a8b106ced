"""The planner's search: micro-batch count x schedule x virtual stages x cuts x recompute.

For every micro-batch count ``m`` that divides the batch (micro-batch size ``u = B/m``, costs
from the Profile's affine fits), every schedule (GPipe, 1F1B, ZB-H1, interleaved 1F1B with v
virtual stages) and the per-stage recomputation choice, the partition solver finds the cuts
that minimise the pipeline's bottleneck under each device's memory limit, given how many
micro-batches of activations the schedule holds on each stage:

    GPipe              k_s = m
    1F1B               k_s = min(m, S - s)            (PipeDream-Flush)
    ZB-H1              k_s = min(m, S)                (W keeps inputs alive past B; conservative)
    interleaved 1F1B   k_j = (w_r + 1) / v per chunk, limit M / v per chunk,
                       w_r = min(2 (S - r - 1) + (v - 1) S, v m) warm-up forwards on rank r

Each candidate — the solver's cuts and three simple splits (even by layers, balanced by
parameters, greedy by time) for the same decision — is then *simulated* with the schedule's
real action lists (``simulate.py``, communication included), and the plan with the shortest
simulated iteration whose simulated peak memory fits every device wins. The simple splits are
also reported as baselines, priced the same way.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from autopipe.costs import Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.plans import Alternative, Baseline, Plan, StagePlan
from autopipe.schedules import SCHEDULES, make_schedule
from autopipe.simulate import (
    CompiledSchedule,
    StageCost,
    Summary,
    Timeline,
    compile_schedule,
    simulate,
    simulate_summary,
)
from autopipe.solve.chain import solve_chain
from autopipe.solve.greedy import solve_fast
from autopipe.solve.ilp import solve_ilp
from autopipe.solve.min_memory import min_memory_limit
from autopipe.solve.problem import (
    Partition,
    PartitionProblem,
    Tensor,
    contiguous_assignment,
    evaluate,
    stage_stats,
)
from autopipe.units import format_bytes

__all__ = ["SEARCH_SCHEDULES", "PlanRequest", "default_link", "plan_pipeline", "plan_timeline"]

SEARCH_SCHEDULES = ("1f1b", "zb-h1", "gpipe", "interleaved-1f1b")  # ties go to the first
_VIRTUAL_CHOICES = (2, 4)
_EXACT_DP_LIMIT = 4_000_000  # n^2 * S above which the bisection solver replaces the DP
_BASELINES = ("even-layers", "by-params", "greedy-time")
_ILP_MAX_BLOCKS = 48  # DAGs up to this many blocks also get the ILP's free placement
_ILP_DECISIONS = 2
_ILP_TIME_LIMIT_S = 10.0


@dataclass(frozen=True)
class PlanRequest:
    """What the user asks for; ``None`` leaves a decision to the search."""

    stages: int  # S: pipeline devices
    batch_size: int  # samples per iteration (per pipeline)
    memory_bytes: float  # per device
    micro_batches: int | None = None
    schedule: str | None = None
    virtual: int | None = None  # stages per device, interleaved 1F1B only
    recompute: str = "auto"  # "auto" | "never" | "always"
    link_bandwidth: float = 10e9  # bytes/s between neighbouring devices
    link_latency_s: float = 20e-6
    state_factor: float = 4.0  # bytes kept per parameter byte: weights, grads, Adam m and v
    alternatives: int = 5


@dataclass(frozen=True)
class _Decision:
    schedule: str
    virtual: int
    micro_batches: int


@dataclass(frozen=True)
class _Candidate:
    decision: _Decision
    source: str  # "solver", "ilp" or a baseline name
    problem: PartitionProblem
    partition: Partition
    costs: list[StageCost] | None = None  # per stage, filled when the candidate is made


def plan_pipeline(profile: Profile, request: PlanRequest) -> Plan:
    """The best plan for ``profile`` under ``request`` (see the module docstring).

    Best-first branch and bound: decisions are opened in the order of a lower bound on any
    plan they can give (:func:`_decision_bound`), candidates simulated in the order of a
    lower bound on their own iteration time (:func:`_candidate_bound`); the search stops when
    no bound left is below the best simulated plan that fits. Nothing skipped can be faster.
    """
    _validate(profile, request)
    decisions = sorted(
        _decisions(profile, request),
        key=lambda d: (_decision_bound(profile, request, d), _order_key(d)),
    )
    simulated: list[tuple[_Candidate, Summary]] = []
    queue: list[tuple[float, int, _Candidate]] = []  # (bound, tie-break, candidate)
    best = math.inf
    infeasible: dict[tuple[str, int], tuple[int, PartitionProblem]] = {}
    next_decision = 0
    counter = itertools.count()
    expand: dict[_Decision, tuple[PartitionProblem, _BlockTimes]] = {}
    while True:
        open_bound = _decision_bound(profile, request, decisions[next_decision]) if next_decision < len(decisions) else math.inf
        if queue and queue[0][0] <= open_bound:
            bound, _, c = heapq.heappop(queue)
            if bound >= best * (1 + 1e-12):
                break
            t = _timeline(profile, request, c)
            simulated.append((c, t))
            if _fits(t, request):
                best = min(best, t.iteration_s)
            if c.source == "solver":
                # The simple splits of this decision are candidates too (and so never win).
                problem, times = expand.pop(c.decision)
                for name in _BASELINES:
                    part = evaluate(problem, _baseline_assignment(name, profile, problem, c.decision))
                    if part.fits and part.stage_of_block != c.partition.stage_of_block:
                        b = _candidate(c.decision, name, problem, part, times)
                        heapq.heappush(queue, (_candidate_bound(profile, request, b), next(counter), b))
            continue
        if open_bound >= best * (1 + 1e-12) or next_decision >= len(decisions):
            break
        decision = decisions[next_decision]
        next_decision += 1
        problem = _problem(profile, request, decision)
        try:
            solved = _solve(problem)
        except InfeasibleError:
            # Keep the most micro-batches per schedule: the least memory, for the error.
            key = (decision.schedule, decision.virtual)
            if decision.micro_batches > infeasible.get(key, (0, problem))[0]:
                infeasible[key] = (decision.micro_batches, problem)
            continue
        times = _BlockTimes.of(profile, request.batch_size // decision.micro_batches)
        c = _candidate(decision, "solver", problem, solved, times)
        heapq.heappush(queue, (_candidate_bound(profile, request, c), next(counter), c))
        expand[decision] = (problem, times)
    if not simulated:
        smallest_fit = math.inf
        for (_, v), (_, problem) in infeasible.items():
            smallest_fit = min(smallest_fit, min_memory_limit(problem) * v)
        raise _infeasible(profile, request, smallest_fit)
    fitting = [(c, t) for c, t in simulated if _fits(t, request)]
    if not fitting:
        raise _infeasible(profile, request, min(max(t.peak_memory_bytes) for _, t in simulated))
    fitting.sort(key=lambda ct: (ct[1].iteration_s, _order(ct[0])))
    fitting = _refine_with_ilp(profile, request, fitting)
    best_candidate, timeline = fitting[0]
    return _make_plan(profile, request, best_candidate, timeline, fitting, simulated)


def _order_key(d: _Decision) -> tuple[int, int, int]:
    return (SEARCH_SCHEDULES.index(d.schedule), d.virtual, d.micro_batches)


def _candidate_bound(profile: Profile, req: PlanRequest, c: _Candidate) -> float:
    """A time the simulator cannot beat for this candidate (its cuts are known now).

    Rank r cannot start before micro-batch 0's forward reaches its first stage r; it runs
    all m F and m B of its stages (r, r + S, ...) before its last B ends; and after that B
    the gradient still crosses every stage before r. Every rank also works m times its
    stages' F + B + W, and micro-batch 0 makes the whole round trip.
    """
    d = c.decision
    u = req.batch_size // d.micro_batches
    costs = _stage_costs(profile, c, u)
    m, S = d.micro_batches, req.stages
    split = d.schedule == "zb-h1"
    f = [x.forward_s for x in costs]
    b = [x.backward_input_s if split else x.backward_s for x in costs]
    w = [x.backward_weight_s if split else 0.0 for x in costs]
    comm = c.partition.comm_s
    busy = [0.0] * S
    work = [0.0] * S
    for j in range(len(costs)):
        busy[j % S] += m * (f[j] + b[j] + w[j])
        work[j % S] += m * (f[j] + b[j])
    bound = max(max(busy), sum(f) + sum(b) + 2 * sum(comm))
    before = 0.0
    for r in range(S):
        bound = max(bound, before + work[r])
        before += f[r] + b[r] + (2 * comm[r] if r < len(comm) else 0.0)
    return bound


def _decision_bound(profile: Profile, req: PlanRequest, d: _Decision) -> float:
    """A time no plan of decision ``d`` can beat, whatever its cuts (so the search may skip it).

    Micro-batch 0 runs forward through every stage and back, one action after another, so
    the iteration takes at least the model's whole F + B for one micro-batch (B: the input-
    gradient part when W is split off); and the ranks share m times the model's total work, so
    the busiest works at least a 1/S share of it.
    """
    u = req.batch_size // d.micro_batches
    blocks = profile.blocks
    total = sum(b.forward_s(u) + b.backward_s(u) for b in blocks)
    if d.schedule == "zb-h1":
        chain = sum(b.forward_s(u) + b.backward_input_s(u) for b in blocks)
    else:
        chain = total
    return max(chain, d.micro_batches * total / req.stages)


def _is_dag(profile: Profile) -> bool:
    return any(t.src >= 0 and any(d != t.src + 1 for d in t.dsts) for t in profile.tensors)


def _refine_with_ilp(
    profile: Profile, req: PlanRequest, fitting: list[tuple[_Candidate, Summary]]
) -> list[tuple[_Candidate, Summary]]:
    """On a small DAG (skip connections), let the ILP place blocks freely — any assignment
    monotone along the edges, not only contiguous ranges of one topological order — for the
    best decisions, and keep its partition where the simulator says it is faster."""
    if not _is_dag(profile) or profile.num_blocks > _ILP_MAX_BLOCKS:
        return fitting
    extra = []
    tried: set[_Decision] = set()
    for c, _ in fitting:
        if len(tried) == _ILP_DECISIONS:
            break
        if c.decision in tried:
            continue
        tried.add(c.decision)
        try:
            part = solve_ilp(c.problem, time_limit_s=_ILP_TIME_LIMIT_S)
        except (InfeasibleError, PlanError):
            continue
        if part.stage_of_block != c.partition.stage_of_block:
            cand = _candidate(c.decision, "ilp", c.problem, part)
            t = _timeline(profile, req, cand)
            if _fits(t, req):
                extra.append((cand, t))
    return sorted(fitting + extra, key=lambda ct: (ct[1].iteration_s, _order(ct[0])))


# --------------------------------------------------------------------------- decisions


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _decisions(profile: Profile, req: PlanRequest) -> list[_Decision]:
    S, n = req.stages, profile.num_blocks
    ms = [req.micro_batches] if req.micro_batches else _divisors(req.batch_size)
    schedules = [req.schedule] if req.schedule else list(SEARCH_SCHEDULES)
    out = []
    for m in ms:
        for name in schedules:
            if name != "interleaved-1f1b":
                out.append(_Decision(name, 1, m))
                continue
            vs = [req.virtual] if req.virtual else list(_VIRTUAL_CHOICES)
            for v in vs:
                if S > 1 and m % S == 0 and S * v <= n:
                    out.append(_Decision(name, v, m))
    return out


def _inflight(decision: _Decision, S: int) -> list[float]:
    m, v = decision.micro_batches, decision.virtual
    if decision.schedule == "gpipe":
        return [float(m)] * S
    if decision.schedule == "1f1b":
        return [float(min(m, S - s)) for s in range(S)]
    if decision.schedule == "zb-h1":
        return [float(min(m, S))] * S
    warm = [min(2 * (S - r - 1) + (v - 1) * S, v * m) for r in range(S)]
    return [(warm[j % S] + 1) / v for j in range(S * v)]


def _problem(profile: Profile, req: PlanRequest, decision: _Decision) -> PartitionProblem:
    u = req.batch_size // decision.micro_batches
    chunks = req.stages * decision.virtual
    blocks = profile.blocks
    return PartitionProblem(
        time_s=tuple(b.forward_s(u) + b.backward_s(u) for b in blocks),
        recompute_s=tuple(b.forward_s(u) for b in blocks),
        static_bytes=tuple(b.param_bytes * req.state_factor for b in blocks),
        activation_bytes=tuple(b.saved_bytes(u) for b in blocks),
        tensors=tuple(Tensor(t.src, t.dsts, t.bytes(u)) for t in profile.tensors if t.dsts),
        stages=chunks,
        inflight=tuple(_inflight(decision, req.stages)),
        memory_limit=(req.memory_bytes / decision.virtual,) * chunks,
        link_latency_s=req.link_latency_s,
        link_bandwidth=req.link_bandwidth,
        recompute=req.recompute,
    )


def _solve(problem: PartitionProblem) -> Partition:
    n = problem.blocks
    if n * n * problem.stages <= _EXACT_DP_LIMIT:
        return solve_chain(problem, explain=False)
    return solve_fast(problem, explain=False)


# --------------------------------------------------------------------------- baselines


def _baseline_assignment(name: str, profile: Profile, p: PartitionProblem, d: _Decision) -> tuple[int, ...]:
    n, S = p.blocks, p.stages
    if name == "even-layers":
        bounds = [round(s * n / S) for s in range(S)]
    elif name == "by-params":
        weights = tuple(float(b.params) for b in profile.blocks)
        bounds = list(_min_max_split(weights, S))
    else:
        bounds = _greedy_split(p.time_s, S)
    return contiguous_assignment(bounds, n)


def _min_max_split(weights: tuple[float, ...], S: int) -> tuple[int, ...]:
    """Contiguous split minimising the largest part (DeepSpeed's 'parameters' method)."""
    n = len(weights)
    p = PartitionProblem(
        time_s=weights,
        recompute_s=(0.0,) * n,
        static_bytes=(0.0,) * n,
        activation_bytes=(0.0,) * n,
        tensors=(),
        stages=S,
        inflight=(0.0,) * S,
        memory_limit=(math.inf,) * S,
        recompute="never",
    )
    return solve_fast(p).boundaries


def _greedy_split(times: Sequence[float], S: int) -> list[int]:
    """Cut where the running time first passes each k/S share of the total."""
    n, total = len(times), sum(times)
    bounds, acc, s = [0], 0.0, 1
    for i, t in enumerate(times):
        if s < S and acc >= s * total / S and i > bounds[-1] and n - i >= S - s:
            bounds.append(i)
            s += 1
        acc += t
    while len(bounds) < S:  # too few cuts: take the last blocks one per stage
        bounds.append(n - (S - len(bounds)))
    return sorted(set(bounds)) if len(set(bounds)) == S else [round(k * n / S) for k in range(S)]


# --------------------------------------------------------------------------- simulation


def _candidate(
    decision: _Decision, source: str, problem: PartitionProblem, part: Partition, times: _BlockTimes | None = None
) -> _Candidate:
    return _Candidate(decision, source, problem, part, _costs_of(problem, part, times) if times is not None else None)


@dataclass(frozen=True)
class _BlockTimes:
    """Per-block times at one micro-batch size (computed once per decision)."""

    f: tuple[float, ...]
    b: tuple[float, ...]
    bi: tuple[float, ...]
    w: tuple[float, ...]

    @staticmethod
    def of(profile: Profile, u: int) -> _BlockTimes:
        bs = profile.blocks
        return _BlockTimes(
            tuple(x.forward_s(u) for x in bs),
            tuple(x.backward_s(u) for x in bs),
            tuple(x.backward_input_s(u) for x in bs),
            tuple(x.backward_weight_s(u) for x in bs),
        )


def _stage_costs(profile: Profile, c: _Candidate, u: int) -> list[StageCost]:
    """What each stage of ``c`` costs per micro-batch, recomputation included."""
    if c.costs is not None:
        return c.costs
    times = _BlockTimes.of(profile, u)
    return _costs_of(c.problem, c.partition, times)


def _costs_of(problem: PartitionProblem, part: Partition, t: _BlockTimes) -> list[StageCost]:
    stats = stage_stats(problem, part.stage_of_block)
    n = problem.stages
    f, b, bi, w = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    for i, s in enumerate(part.stage_of_block):
        f[s] += t.f[i]
        b[s] += t.b[i]
        bi[s] += t.bi[i]
        w[s] += t.w[i]
    costs = []
    for s in range(n):
        rc = part.recompute[s]
        held = stats.in_bytes[s] if rc else stats.act[s]
        extra = f[s] if rc else 0.0
        costs.append(
            StageCost(
                forward_s=f[s],
                backward_s=b[s] + extra,
                backward_input_s=bi[s] + extra,
                backward_weight_s=w[s],
                activation_bytes=held,
                weight_grad_bytes=held,
                transient_bytes=stats.act[s] if rc else 0.0,
                static_bytes=stats.static[s],
            )
        )
    return costs


@functools.lru_cache(maxsize=128)
def _compiled(name: str, stages: int, micro_batches: int, virtual: int) -> CompiledSchedule:
    # The generators are tested against the full validator; compiling re-checks the essentials.
    return compile_schedule(SCHEDULES[name](stages, micro_batches, virtual), stages, virtual)


def _timeline(profile: Profile, req: PlanRequest, c: _Candidate) -> Summary:
    d = c.decision
    u = req.batch_size // d.micro_batches
    compiled = _compiled(d.schedule, req.stages, d.micro_batches, d.virtual)
    return simulate_summary(compiled, _stage_costs(profile, c, u), c.partition.comm_s)


def _fits(t: Summary, req: PlanRequest) -> bool:
    return all(m <= req.memory_bytes * (1 + 1e-9) for m in t.peak_memory_bytes)


def _order(c: _Candidate) -> tuple[int, int, int, int]:
    d = c.decision
    sources = ("solver", "ilp", *_BASELINES)
    return (SEARCH_SCHEDULES.index(d.schedule), d.virtual, d.micro_batches, sources.index(c.source))


# --------------------------------------------------------------------------- results


def _make_plan(
    profile: Profile,
    req: PlanRequest,
    best: _Candidate,
    timeline: Summary,
    fitting: list[tuple[_Candidate, Summary]],
    simulated: list[tuple[_Candidate, Summary]],
) -> Plan:
    d = best.decision
    u = req.batch_size // d.micro_batches
    part = best.partition
    stats = stage_stats(best.problem, part.stage_of_block)
    stages = []
    for s in range(best.problem.stages):
        members = tuple(i for i, x in enumerate(part.stage_of_block) if x == s)
        rc = part.recompute[s]
        f = sum(profile.blocks[i].forward_s(u) for i in members)
        stages.append(
            StagePlan(
                index=s,
                rank=s % req.stages,
                blocks=tuple(profile.blocks[i].name for i in members),
                block_indices=members,
                nodes=tuple(n for i in members for n in profile.blocks[i].nodes),
                params=sum(profile.blocks[i].params for i in members),
                forward_s=f,
                backward_s=part.stage_time_s[s] - f,
                backward_input_s=sum(profile.blocks[i].backward_input_s(u) for i in members) + (f if rc else 0.0),
                backward_weight_s=sum(profile.blocks[i].backward_weight_s(u) for i in members),
                recompute=rc,
                memory_bytes=timeline.peak_memory_bytes[s] if d.virtual == 1 else part.stage_memory_bytes[s],
                static_bytes=stats.static[s],
                activation_bytes=stats.act[s],
                held_bytes=stats.in_bytes[s] if rc else stats.act[s],
                send_bytes=part.cut_bytes[s] if s < len(part.cut_bytes) else 0.0,
            )
        )
    seen = {(d.schedule, d.virtual, d.micro_batches)}
    alternatives: list[Alternative] = []
    for c, t in fitting[1:]:
        key = (c.decision.schedule, c.decision.virtual, c.decision.micro_batches)
        if key in seen or len(alternatives) >= req.alternatives:
            continue
        seen.add(key)
        alternatives.append(
            Alternative(c.decision.schedule, c.decision.virtual, c.decision.micro_batches, t.iteration_s, t.bubble_fraction, max(t.peak_memory_bytes), c.source)
        )
    return Plan(
        model=profile.model,
        model_file=profile.model_file,
        factory=profile.factory,
        model_kwargs=profile.model_kwargs,
        tracer=profile.tracer,
        leaf_modules=profile.leaf_modules,
        max_blocks=profile.max_blocks,
        fingerprint=profile.fingerprint,
        profile_device=profile.device,
        devices=req.stages,
        virtual=d.virtual,
        schedule=d.schedule,
        micro_batches=d.micro_batches,
        micro_batch_size=u,
        batch_size=req.batch_size,
        memory_limit_bytes=req.memory_bytes,
        link_bandwidth=req.link_bandwidth,
        link_latency_s=req.link_latency_s,
        recompute_policy=req.recompute,
        stages=tuple(stages),
        iteration_time_s=timeline.iteration_s,
        bubble_fraction=timeline.bubble_fraction,
        throughput=req.batch_size / timeline.iteration_s if timeline.iteration_s > 0 else math.inf,
        peak_memory_bytes=timeline.peak_memory_bytes,
        alternatives=tuple(alternatives),
        baselines=tuple(_baselines(profile, req, best)),
    )


def _baselines(profile: Profile, req: PlanRequest, best: _Candidate) -> list[Baseline]:
    """The simple splits under the chosen decision, without recomputation (as others run them)."""
    d, p = best.decision, best.problem
    out = []
    for name in _BASELINES:
        assignment = _baseline_assignment(name, profile, p, d)
        rc = (p.recompute == "always",) * p.stages
        part = evaluate(p, assignment, rc)
        c = _candidate(d, name, p, part)
        t = _timeline(profile, req, c)
        sizes = tuple(assignment.count(s) for s in range(p.stages))
        out.append(Baseline(name, sizes, t.iteration_s, t.bubble_fraction, t.peak_memory_bytes, _fits(t, req)))
    return out


def plan_timeline(plan: Plan) -> Timeline:
    """Simulate ``plan`` again from its own numbers (what ``autopipe show`` draws)."""
    costs = [
        StageCost(
            forward_s=s.forward_s,
            backward_s=s.backward_s,
            backward_input_s=s.backward_input_s,
            backward_weight_s=s.backward_weight_s,
            activation_bytes=s.held_bytes,
            weight_grad_bytes=s.held_bytes,
            transient_bytes=s.activation_bytes if s.recompute else 0.0,
            static_bytes=s.static_bytes,
        )
        for s in plan.stages
    ]
    comm = [
        plan.link_latency_s + s.send_bytes / plan.link_bandwidth if s.send_bytes > 0 else 0.0
        for s in plan.stages[:-1]
    ]
    schedule = make_schedule(plan.schedule, plan.devices, plan.micro_batches, plan.virtual)
    return simulate(schedule, costs, comm, stages=plan.devices)


def default_link(device: str) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) between neighbouring devices, by the profile's device.

    GPUs: 50 GB/s and 10 us (between PCIe 5.0 x16 and NVLink: a conservative default);
    CPU processes talking over gloo on one host: 5 GB/s and 50 us.
    """
    if device.startswith("cuda"):
        return 50e9, 10e-6
    return 5e9, 50e-6


# --------------------------------------------------------------------------- checks


def _validate(profile: Profile, req: PlanRequest) -> None:
    n, S, B = profile.num_blocks, req.stages, req.batch_size
    if S < 1:
        raise PlanError(f"--stages must be at least 1 (got {S})")
    if S > n:
        raise PlanError(
            f"cannot cut {n} blocks into {S} stages; use --stages {n} or fewer, or finer blocks when profiling (--blocks)"
        )
    if B < 1:
        raise PlanError(f"--batch-size must be at least 1 (got {B})")
    if not req.memory_bytes > 0:
        raise PlanError(f"--memory must be positive (got {req.memory_bytes})")
    if req.micro_batches is not None:
        m = req.micro_batches
        if m < 1:
            raise PlanError(f"--micro-batches must be at least 1 (got {m})")
        if B % m:
            some = ", ".join(str(x) for x in _divisors(B))
            raise PlanError(f"batch size {B} is not divisible into {m} micro-batches; use one of {some}")
    if req.schedule is not None and req.schedule not in SCHEDULES:
        raise PlanError(f"unknown schedule {req.schedule!r}; use one of {', '.join(SEARCH_SCHEDULES)}")
    if req.virtual is not None:
        if req.virtual < 1:
            raise PlanError(f"--virtual must be at least 1 (got {req.virtual})")
        if req.schedule not in (None, "interleaved-1f1b"):
            raise PlanError(f"--virtual applies to the interleaved-1f1b schedule only (got --schedule {req.schedule})")
        if S * req.virtual > n:
            raise PlanError(f"{S} devices x {req.virtual} virtual stages needs {S * req.virtual} blocks, the model has {n}")
    if req.schedule == "interleaved-1f1b" and req.micro_batches is not None and req.micro_batches % S:
        raise PlanError(f"interleaved-1f1b needs the micro-batch count to be a multiple of {S} stages (got {req.micro_batches})")
    if req.recompute not in ("auto", "never", "always"):
        raise PlanError(f"recompute must be auto, never or always (got {req.recompute!r})")
    if not req.link_bandwidth > 0 or req.link_latency_s < 0:
        raise PlanError("link bandwidth must be positive and latency non-negative")
    if not _decisions(profile, req):
        raise PlanError(
            f"no schedule fits the request: interleaved-1f1b needs micro-batches divisible by {S} and {S} x v <= {n} blocks"
        )


def _infeasible(profile: Profile, req: PlanRequest, need: float) -> InfeasibleError:
    fixes = "more stages or smaller micro-batches" if req.recompute != "never" else "more stages, recomputation, or smaller micro-batches"
    need_text = f"; the smallest limit that fits is {format_bytes(need, round_up=True)} per device" if math.isfinite(need) else ""
    return InfeasibleError(
        f"no plan of {profile.num_blocks} blocks on {req.stages} devices fits {format_bytes(req.memory_bytes)} per device"
        f"{need_text} (or use {fixes})",
        min_memory_bytes=need if math.isfinite(need) else None,
    )
