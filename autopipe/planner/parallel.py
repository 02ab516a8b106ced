"""Tensor x pipeline x data parallel: split G devices into t-wide groups, S stages, D replicas.

Tensor parallelism (Megatron-LM: Shoeybi et al. 2019; Narayanan et al. 2021) splits every
transformer layer over ``t`` devices of one node (``t`` divides the devices per node, the
attention heads and the key/value heads); its per-device costs, collectives and memory are
priced by ``costs.tensor`` and handed here as one profile per ``t`` (:class:`TensorOptions`;
without it, ``t = 1``). For every ``t`` and pipeline depth S with ``t * S`` dividing G, and
D = G / (t S), each replica trains ``global_batch / D`` samples per iteration; the pipeline
planner (:func:`~autopipe.planner.search.plan_pipeline`) chooses cuts, micro-batches, schedule,
virtual stages and recomputation for that share. Where the ranks go and what their links and
collectives cost: :mod:`autopipe.planner.placement`.

**Sharding** is searched with them (or pinned): for D > 1, every way the target runs of
splitting the state over a stage's replicas (ZeRO-1, -2, -3, FSDP once a step), over all of
them or, hybrid, over a node's (``placement``'s formulas for memory and collectives). Each
changes the pipeline search's memory per parameter and, zero2 and zero3, its blocks' times
(:mod:`autopipe.planner.cluster`); the step ends with the once-a-step collectives::

    step_s = simulated pipeline iteration + what the data-parallel collectives add past it

serially (every device's reduction after its pipeline: Patarasuk & Yuan 2009's ring) or, where
the request's :class:`~autopipe.plans.Overlap` says so (its target's by default), overlapped
with each chunk's last backward and first forward on the simulated timeline
(``simulate.overlap``). Where two shardings give the same step the less sharded is kept.

The search is exact and pruned. A (t, S, D) and its shardings whose lower bound on the step
(:func:`_bound`) is not below the runner-up so far is skipped; the others are searched with the
best so far of the same (t, S), or else the runner-up, as the time to beat (``plan_search``'s
``incumbent``, less the least the collectives can add), so a pipeline search stops as soon as
its own bounds say it cannot place. The shardings that keep the blocks' times as profiled are
searched together, the least memory first: where its plan fits a sharding that keeps more, it is
that sharding's plan too (:func:`~autopipe.planner.cluster.restamp`). Splits are opened
likeliest first (:func:`_estimate`: the bound, plus a whole recomputation where even one stage's
state and 1F1B's in-flight activations cannot fit), so the runner-up comes early; the best is
searched again in full when it was searched against an incumbent (its plan lists its own
runners-up). The result is the best layout and the runner-up with another (t, S); pure: no
torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autopipe.costs.profile import Profile
from autopipe.costs.tensor import tensor_degrees, tensor_reason
from autopipe.errors import InfeasibleError, PlanError
from autopipe.modes import Sharding
from autopipe.planner.cluster import (
    NO_SHARDING,
    ShardOption,
    TensorOptions,
    data_parallel_s,
    element_bytes,
    group_of,
    least_step_comm,
    restamp,
    shard_options,
    sharded_profile,
    state_factor,
    target_overlap,
    transient,
    with_transient,
)
from autopipe.planner.noise import robust_plan
from autopipe.planner.placement import Cluster, DataGroup, Layout, layouts, ring_allreduce_s
from autopipe.planner.pricing import Schedules
from autopipe.planner.request import NO_CHOICES, Choices, divisors, validate
from autopipe.planner.search import PlanRequest, Progress, SharedCuts, plan_search
from autopipe.plans import MAX_MICRO_BATCHES, MAX_REPLICAS, Overlap, Plan
from autopipe.schedules import schedule_names
from autopipe.schedules.targets import target_spec
from autopipe.units import format_bytes

__all__ = [
    "Cluster",
    "Layout",
    "ParallelOption",
    "ParallelPlan",
    "ParallelRequest",
    "Rejected",
    "TensorOptions",
    "layouts",
    "model_flops",
    "plan_parallel",
    "ring_allreduce_s",
]


@dataclass(frozen=True)
class ParallelRequest:
    """What to plan: the planner's own choices may be pinned as in ``PlanRequest``."""

    cluster: Cluster
    global_batch: int  # samples per iteration over all replicas
    memory_limit: float  # bytes per device
    bytes_per_param: float = 16.0  # weights + grads + optimizer state, per parameter
    shard_optimizer: bool = False  # pin ZeRO-1 (sharding=zero1's older name)
    stages: int | None = None  # pin S, the pipeline depth
    choices: Choices = NO_CHOICES  # pinned micro-batches (per replica), schedule, v, recomputation
    alternatives: int = 5
    action_overhead_s: float = 0.0  # the executor's cost per action (PlanRequest's)
    tensor_parallel: int | None = None  # pin t
    data_parallel: int | None = None  # pin D
    sharding: Sharding | None = None  # pin how the state is split over the replicas (None: searched)
    shard_group: int | None = None  # pin the replicas it is split over (hybrid; None: all, or searched)
    overlap: Overlap | None = None  # what the time model overlaps (None: the target's, cluster.target_overlap)


@dataclass(frozen=True)
class ParallelOption:
    layout: Layout
    plan: Plan  # data_parallel, sharding and allreduce_s filled in
    sharding: ShardOption = NO_SHARDING  # as the search took it

    @property
    def step_time_s(self) -> float:
        return self.plan.step_time_s

    def describe(self) -> str:
        lay, p = self.layout, self.plan
        shards = f" over {p.shard_group}" if p.shard_group else ""
        state = f", {p.sharding}{shards}" if p.data_parallel > 1 else ""
        return (
            f"t={lay.tensor_parallel} x S={lay.stages} x D={lay.data_parallel} ({lay.placement}{state}): "
            f"{p.schedule}, m={p.micro_batches}, "
            f"step {_seconds(p.step_time_s)} (pipeline {_seconds(p.iteration_time_s)} "
            f"+ data-parallel {_seconds(p.allreduce_s)})"
        )


def _seconds(s: float) -> str:
    return f"{s:.3f} s" if s >= 1.0 else f"{s * 1e3:.3f} ms"


@dataclass(frozen=True)
class Rejected:
    stages: int
    data_parallel: int
    reason: str  # one line
    min_memory_bytes: float | None = None  # the smallest limit that fits this (S, D), when known
    tensor_parallel: int = 1


@dataclass(frozen=True)
class ParallelPlan:
    best: ParallelOption
    runner_up: ParallelOption | None  # the best with another (t, S)
    rejected: tuple[Rejected, ...]  # the (t, S, D) with no plan, and why
    pruned: int = 0  # (t, S, D) shardings skipped because their bound could not beat the runner-up

    @property
    def plan(self) -> Plan:
        return self.best.plan


@dataclass(frozen=True)
class _Split:
    """A (t, S, D) with shardings to search together, and where it stands in the queue."""

    estimate: float
    bound: float
    t: int
    S: int
    D: int
    options: tuple[ShardOption, ...]
    profile: Profile  # one device's at degree t

    def key(self) -> tuple[float, float, int, int, int]:
        return self.estimate, self.bound, self.t, self.S, self.D


@dataclass(frozen=True)
class _Context:
    """What every split's search shares: the request, its overlap, the schedules compiled."""

    request: ParallelRequest
    overlap: Overlap
    blocking: tuple[str, ...]  # the schedules whose sends block the sender
    sequence_parallel: bool
    schedules: Schedules
    progress: Progress | None
    partial: set[tuple[int, int, int, ShardOption]]  # (t, S, D, sharding) searched with a time to beat
    cuts: SharedCuts  # the pipeline searches' unlimited cuts, per profile and link


def plan_parallel(
    profile: Profile, request: ParallelRequest, progress: Progress | None = None, tensor: TensorOptions | None = None
) -> ParallelPlan:
    """The (t, S, D) layout, sharding and pipeline plan with the shortest step that fits memory;
    ``progress(what, done, total)`` is told each search (``plan_pipeline``'s), per layout.
    ``profile`` is the whole model on one device (t = 1); ``tensor`` prices t > 1."""
    G, B = request.cluster.devices, request.global_batch
    if G < 1 or B < 1:
        raise PlanError(f"need at least one device and one sample (got {G} devices, batch {B})")
    if request.stages is not None and (request.stages < 1 or G % request.stages):
        raise PlanError(f"--stages {request.stages} does not divide {G} devices; use a divisor of {G}")
    overlap = target_overlap(request.choices.target, request.overlap)
    sync = schedule_names() if not overlap.p2p else target_spec(request.choices.target).blocking_p2p
    sp = tensor is not None and tensor.sequence_parallel
    ctx = _Context(request, overlap, tuple(sync), sp, Schedules(), progress, set(), SharedCuts())
    degrees, skipped = _degrees(request, tensor)
    rejected = [Rejected(0, 0, why, tensor_parallel=t) for t, why in skipped]
    candidates: list[_Split] = []
    for t in degrees:
        prof = profile if t == 1 else tensor.price(t)  # type: ignore[union-attr]
        for S in [request.stages] if request.stages else divisors(G // t):
            if (G // t) % S:
                rejected.append(
                    Rejected(S, 0, f"{S} stages do not divide {G // t} = {G} devices / t={t}", tensor_parallel=t)
                )
                continue
            found, why = _splits(prof, ctx, t, S, G // (t * S))
            candidates += found
            if why:
                rejected.append(Rejected(S, G // (t * S), why, tensor_parallel=t))
    candidates.sort(key=_Split.key)
    options: list[ParallelOption] = []
    pruned = 0
    for c in candidates:
        target = _runner_up_step(options)
        if c.bound * (1 - 1e-9) >= target:
            pruned += 1
            continue
        beat = min([target] + [o.step_time_s for o in options if _key(o) == (c.t, c.S)])
        found_options = _options(c, ctx, rejected, beat)
        pruned += found_options is None
        options.extend(found_options or [])
    if not options:
        raise _no_layout(request, rejected)
    options = _simplest(options)
    best = options[0]
    if (*_split_of(best), best.sharding) in ctx.partial:  # again, alone and in full, for the plan's runners-up
        searched = next(c for c in candidates if (c.t, c.S, c.D) == _split_of(best) and best.sharding in c.options)
        alone = replace(searched, options=(best.sharding,))
        again = [o for o in _options(alone, ctx, [], math.inf) or [] if o.layout == best.layout]
        options = _simplest([o for o in options if o is not best] + again)
    best = options[0]
    runner_up = next((o for o in options if _key(o) != _key(best)), None)
    note = f"chose {best.describe()}; runner-up: {runner_up.describe() if runner_up else 'none fits'}"
    flops = model_flops(profile, best.plan)
    best = replace(best, plan=replace(best.plan, parallel_note=note, model_flops=flops[0], hardware_flops=flops[1]))
    return ParallelPlan(best, runner_up, tuple(rejected), pruned)


def _degrees(request: ParallelRequest, tensor: TensorOptions | None) -> tuple[list[int], list[tuple[int, str]]]:
    cluster = request.cluster
    shape = tensor.shape if tensor is not None else None
    if request.tensor_parallel is not None:
        t = request.tensor_parallel
        why = tensor_reason(shape, t, cluster.devices_per_node, cluster.devices)
        if t < 1 or why:
            fix = (
                "plan it analytically (--device NAME) or drop --tensor-parallel"
                if shape is None
                else "pick a degree that divides them"
            )
            raise PlanError(f"--tensor-parallel {t}: {why or 'use a whole number >= 1'}; {fix}")
        return [t], []
    return tensor_degrees(shape, cluster.devices_per_node, cluster.devices)


def _cannot(profile: Profile, request: ParallelRequest, S: int, D: int) -> str | None:
    """Why (t, S, D) has no plan whatever its sharding, or None."""
    B = request.global_batch
    if request.data_parallel is not None and D != request.data_parallel:
        return f"data-parallel width {D}, pinned to {request.data_parallel}"
    if S > profile.num_blocks:
        return f"{S} stages but the model has {profile.num_blocks} blocks"
    if B % D:
        return f"global batch {B} does not split into {D} equal replicas"
    if D > MAX_REPLICAS:
        return f"{D} replicas, more than autopipe plans (at most {MAX_REPLICAS} = 2**20)"
    return None


def _splits(profile: Profile, ctx: _Context, t: int, S: int, D: int) -> tuple[list[_Split], str]:
    """The queue item of (t, S, D), its shardings whose state can fit, searched together; or why
    there is none."""
    request = ctx.request
    why = _cannot(profile, request, S, D)
    if why is not None:
        return [], why
    pinned = Sharding.ZERO1 if request.shard_optimizer and request.sharding is None else request.sharding
    options, why = shard_options(request.choices.target, S, D, pinned, request.shard_group)
    lays = layouts(S, D, request.cluster, t)
    fitting = []
    for option in options:
        need = _static_bound(profile, request, S, lays, option)
        if need <= request.memory_limit:
            fitting.append(option)
        elif need < math.inf and (not why or option.kind == Sharding.ZERO3):
            why = (
                f"needs at least {format_bytes(need, round_up=True)} per device for weights, gradients and "
                f"optimizer state{f' ({option.kind} over its replicas)' if D > 1 else ''}"
            )
    if not fitting:
        return [], why
    bound = min(_bound(profile, ctx, t, S, D, o, lays) for o in fitting)
    least = min(fitting, key=lambda o: _static_bound(profile, request, S, lays, o))
    return [_Split(_estimate(profile, request, S, D, bound, lays, least), bound, t, S, D, tuple(fitting), profile)], ""


def _most_shards(option: ShardOption, lays: Sequence[Layout]) -> int:
    return max((n for lay in lays if (n := option.shards(lay)) is not None), default=0)


def _static_bound(profile: Profile, request: ParallelRequest, S: int, lays: Sequence[Layout], o: ShardOption) -> float:
    """Bytes some device of an S-stage pipeline holds at least under ``o``, before any activation."""
    shards = _most_shards(o, lays)
    if not shards:
        return math.inf
    factor = state_factor(profile, request.bytes_per_param, o.kind, shards)
    per_block = [(b.param_bytes + b.shared_param_bytes) * factor for b in profile.blocks]
    return max(sum(per_block) / S, max(per_block, default=0.0)) + transient(profile, o.kind)


def _bound(profile: Profile, ctx: _Context, t: int, S: int, D: int, o: ShardOption, lays: Sequence[Layout]) -> float:
    """A lower bound on the step of any plan of (t, S, D) under ``o``, whatever its layout,
    schedule and cuts: :func:`_work_bound` of the blocks with the fastest link's collectives,
    plus the least the once-a-step collectives add."""
    cluster = ctx.request.cluster
    groups = [g for lay in lays if (g := group_of(o, lay, cluster)) is not None]
    if not groups:
        return math.inf
    fastest = max(groups, key=lambda g: g.inner_bandwidth)
    work = _work_bound(sharded_profile(profile, o.kind, fastest, ctx.overlap), ctx.request, S, D)
    return work + min(least_step_comm(profile, S, o.kind, g, ctx.overlap) for g in groups)


def _work_bound(profile: Profile, request: ParallelRequest, S: int, D: int) -> float:
    """A lower bound on the pipeline of any plan of S stages for D replicas: for the best micro-batch
    count m (size u = U / m of the replica's share U), the larger of the busiest device's work, at
    least the average m (F + B)(u) / S, and micro-batch 0's chain forward through every block and
    back (input gradients). Recomputation and hops only add."""
    U = request.global_batch // D
    counts = (
        [request.choices.micro_batches]
        if request.choices.micro_batches
        else [m for m in divisors(U) if m <= MAX_MICRO_BATCHES]
    )
    best = math.inf
    for m in counts:
        u = U / m
        work = m * sum(b.forward_s(u) + b.backward_s(u) for b in profile.blocks) / S
        chain = sum(b.forward_s(u) for b in profile.blocks) + sum(b.backward_input_s(u) for b in profile.blocks[1:])
        best = min(best, max(work, chain))
    return best


def _key(option: ParallelOption) -> tuple[int, int]:
    return option.layout.tensor_parallel, option.layout.stages


def _split_of(option: ParallelOption) -> tuple[int, int, int]:
    return option.layout.tensor_parallel, option.layout.stages, option.layout.data_parallel


def _order(option: ParallelOption) -> tuple[float, int, int, str, tuple[int, bool]]:
    lay = option.layout
    return option.step_time_s, lay.tensor_parallel, lay.stages, lay.placement, option.sharding.rank()


def _simplest(options: list[ParallelOption]) -> list[ParallelOption]:
    """``options`` fastest first, a sharding kept only where it beats (by more than rounding) every
    less sharded one of its layout."""
    kept = []
    for o in options:
        simpler = [x for x in options if x.layout == o.layout and x.sharding.rank() < o.sharding.rank()]
        if all(o.step_time_s < x.step_time_s * (1 - 1e-9) for x in simpler):
            kept.append(o)
    return sorted(kept, key=_order)


def _runner_up_step(options: list[ParallelOption]) -> float:
    """The step of the best plan of another (t, S) than the best's so far (inf: none yet): a
    split that cannot beat it can be neither the best nor the runner-up."""
    ranked = sorted(options, key=_order)
    second = next((o for o in ranked if _key(o) != _key(ranked[0])), None)
    return second.step_time_s if second is not None else math.inf


def _estimate(
    profile: Profile, request: ParallelRequest, S: int, D: int, bound: float, lays: Sequence[Layout], o: ShardOption
) -> float:
    """Where to open (t, S, D) in the search (order only, never to skip): its ``bound``, plus
    the forward of every micro-batch again (whole recomputation) when the static bound and
    1F1B's in-flight activations of the smallest micro-batch, min(m, S) of them on a stage,
    exceed the memory limit."""
    U = request.global_batch // D
    m = request.choices.micro_batches or min(U, MAX_MICRO_BATCHES)
    u = U / m
    saved = sum(b.saved_bytes(u) for b in profile.blocks) / S * min(m, S)
    if _static_bound(profile, request, S, lays, o) + saved <= request.memory_limit:
        return bound
    return bound + m * sum(b.forward_s(u) for b in profile.blocks) / S


def _options(c: _Split, ctx: _Context, rejected: list[Rejected], beat: float) -> list[ParallelOption] | None:
    """The plans of ``c``, one per distinct layout and sharding; None when none is faster than
    ``beat`` (a step to beat: the search then stops early, and says no more than that).

    On each layout the shardings whose blocks keep their profiled times go first, the least state
    first: a plan of one that fits another is that one's too (:func:`_reused`). A sharding is not
    searched where its bound, or the pipeline of one that keeps less with the least its own
    collectives add, cannot beat the best so far; nor, in the free search of a pipeline, one that
    gathers or reduces per micro-batch where another fits with nothing recomputed (:func:`_needless`)."""
    request, cluster = ctx.request, ctx.request.cluster
    out: list[ParallelOption] = []
    plans: dict[tuple[object, ...], Plan | None] = {}  # (link, blocks' times, state, gathered) -> plan
    failed: dict[ShardOption, Exception] = {}
    whole = False  # a sharding with the blocks' own times fits with nothing recomputed
    for lay in layouts(c.S, c.D, cluster, c.t):
        link = (lay.p2p_bandwidth, lay.p2p_latency_s)
        for o, group, prof, factor, extra in _in_order(c, ctx, lay):
            if o in failed or _needless(o, c, prof, request, whole):
                continue
            timed = (link,) if prof is c.profile else (link, o.kind, group)
            key = (*timed, factor, extra)
            if key not in plans:
                incumbent = min(beat, _best(out))
                least = least_step_comm(c.profile, c.S, o.kind, group, ctx.overlap)
                plan, searched = _reused(plans, timed, factor, extra, request.memory_limit, incumbent - least)
                searched = searched or _dominated(o, c.options, ctx.overlap)
                if plan is None and not searched:
                    try:
                        plan = _search(c, ctx, lay, prof, factor, extra, incumbent, least)
                    except (InfeasibleError, PlanError) as e:
                        if not isinstance(e, InfeasibleError) or incumbent == math.inf:
                            failed[o] = e  # no plan on any link: memory does not depend on it
                        plans[key] = None  # or none faster than the step to beat
                        continue
                    if incumbent < math.inf:
                        ctx.partial.add((c.t, c.S, c.D, o))
                elif plan is not None:
                    ctx.partial.add((c.t, c.S, c.D, o))  # its runners-up are another search's
                plans[key] = plan
            plan = plans[key]
            if plan is not None:
                out.append(ParallelOption(lay, _priced(c.profile, plan, lay, o, group, extra, ctx), o))
                whole = whole or (prof is c.profile and not any(s.recompute for s in plan.stages))
    if not out and beat == math.inf and failed:
        lays = layouts(c.S, c.D, cluster, c.t)
        error = failed[min(failed, key=lambda o: _static_bound(c.profile, request, c.S, lays, o))]
        need = error.min_memory_bytes if isinstance(error, InfeasibleError) else None
        rejected.append(Rejected(c.S, c.D, str(error), need, c.t))
    return out if out or beat == math.inf else None


def _in_order(c: _Split, ctx: _Context, lay: Layout) -> list[tuple[ShardOption, DataGroup, Profile, float, float]]:
    """``c``'s shardings that apply on ``lay``, with their group, blocks, state factor and gathered
    bytes: those that keep the blocks' times first, then by state per parameter and gathered bytes."""
    request = ctx.request
    out = []
    for o in c.options:
        group = group_of(o, lay, request.cluster)
        if group is None:
            continue
        prof = sharded_profile(c.profile, o.kind, group, ctx.overlap)
        factor = state_factor(c.profile, request.bytes_per_param, o.kind, group.shard)
        out.append((o, group, prof, factor, transient(c.profile, o.kind)))
    return sorted(out, key=lambda x: (x[2] is not c.profile, x[3], x[4]))


def _needless(o: ShardOption, c: _Split, prof: Profile, request: ParallelRequest, whole: bool) -> bool:
    """Whether the free search leaves out ``o``, a sharding whose blocks gather or reduce each
    micro-batch (not hidden) on a pipeline, because one with the blocks' own times already fits with
    nothing recomputed (``whole``): the memory it frees is not worth a collective per block and
    micro-batch. (Pinned, or without a pipeline, it is searched.)"""
    pinned = request.sharding is not None or request.shard_optimizer
    if pinned or prof is c.profile or c.S == 1:
        return False
    return whole


def _best(options: list[ParallelOption]) -> float:
    return min((o.step_time_s for o in options), default=math.inf)


def _reused(
    plans: dict[tuple[object, ...], Plan | None],
    timed: tuple[object, ...],
    factor: float,
    extra: float,
    limit: float,
    beat: float,
) -> tuple[Plan | None, bool]:
    """(a plan, whether no search is needed) from the plans found on the same link and blocks'
    times with no more state per parameter and gathered bytes: the first that also fits ``factor``
    and ``extra`` is its plan too, its memory restamped (cluster.restamp; whatever fits the one that
    keeps more fits the one that keeps less); where none fits and one's pipeline alone is not below
    ``beat``, none is needed (whose plans keep more state cannot be faster)."""
    for key, plan in plans.items():
        if plan is None or key[: len(timed)] != timed or len(key) != len(timed) + 2:
            continue
        had, gathered = key[-2], key[-1]
        assert isinstance(had, float) and isinstance(gathered, float)
        if had > factor or gathered > extra:
            continue
        if (again := restamp(plan, factor / had, limit - extra)) is not None:
            return again, True
        if plan.iteration_time_s * (1 - 1e-9) >= beat:
            return None, True
    return None, False


def _dominated(o: ShardOption, options: Sequence[ShardOption], overlap: Overlap) -> bool:
    """Whether ``o`` (no sharding) is never faster than ZeRO-1 (or ZeRO-3 once a step, which prices
    as it) over the same replicas, searched beside it: with the collectives serial, an all-reduce
    moves what a reduce-scatter and an all-gather move, and whatever fits ``o`` fits ZeRO-1, so
    ``o`` only ties, with the same plan (which :func:`_reused` finds)."""
    serial = not (overlap.grad_reduce or overlap.param_gather)
    flat = {x.kind for x in options if x.group is None and not x.node}
    return serial and o.kind == Sharding.NONE and bool(flat & {Sharding.ZERO1, Sharding.ZERO3_STEP})


def _search(
    c: _Split, ctx: _Context, lay: Layout, profile: Profile, factor: float, extra: float, incumbent: float, least: float
) -> Plan:
    """The pipeline plan of ``lay`` for ``profile`` (with its sharding's collectives), ``factor``
    bytes of state per parameter byte and ``extra`` bytes gathered on every device; InfeasibleError
    where none fits, or none whose step can beat ``incumbent`` (the collectives add at least ``least``)."""
    request = ctx.request
    if _work_bound(profile, request, c.S, c.D) + least >= incumbent * (1 + 1e-9):
        raise InfeasibleError("no plan faster than the step to beat")
    req = PlanRequest(
        devices=lay.stages,
        batch_size=request.global_batch // lay.data_parallel,
        memory_limit=request.memory_limit - extra,
        micro_batches=request.choices.micro_batches,
        schedule=request.choices.schedule,
        virtual=request.choices.virtual,
        recompute=request.choices.recompute,
        target=request.choices.target,
        link_bandwidth=lay.p2p_bandwidth,
        link_latency_s=lay.p2p_latency_s,
        state_factor=factor,
        alternatives=request.alternatives,
        action_overhead_s=request.action_overhead_s,
        blocking_sends=ctx.blocking,
    )
    if req.memory_limit <= 0:
        raise InfeasibleError(f"the gathered weights and gradients alone take {format_bytes(extra)} per device")
    progress = ctx.progress
    told = None if progress is None else _labelled(progress, f"t={c.t} x S={c.S} x D={c.D}: ")
    validate(profile, req)
    return robust_plan(profile, req, plan_search(profile, req, told, incumbent - least, ctx.cuts))


def _labelled(progress: Progress, label: str) -> Progress:
    return lambda what, done, total: progress(label + what, done, total)


def _priced(
    profile: Profile, plan: Plan, lay: Layout, o: ShardOption, group: DataGroup, extra: float, ctx: _Context
) -> Plan:
    """``plan`` as one of D replicas: the gathered state back in its memory, the once-a-step
    collectives in its step, the sharding and overlaps it was priced with."""
    request, D = ctx.request, lay.data_parallel
    sharded = o.kind if D > 1 else Sharding.NONE
    plan = replace(
        with_transient(plan, extra, request.memory_limit),
        overlap=replace(ctx.overlap, p2p=plan.schedule not in ctx.blocking),
    )
    exposed, whole = data_parallel_s(plan, sharded, group, element_bytes(profile), ctx.overlap, ctx.schedules)
    step = plan.iteration_time_s + exposed
    return replace(
        plan,
        data_parallel=D,
        allreduce_s=exposed,
        dp_comm_s=whole,
        throughput=request.global_batch / step if step > 0 else math.inf,
        link_bandwidth=lay.p2p_bandwidth,
        tensor_parallel=lay.tensor_parallel,
        sequence_parallel=ctx.sequence_parallel and lay.tensor_parallel > 1,
        shard_optimizer=sharded != Sharding.NONE,
        sharding=sharded,
        shard_group=group.shard if group.shard < D else 0,
    )


def model_flops(profile: Profile, plan: Plan) -> tuple[float, float]:
    """(model, hardware) FLOPs of one iteration on all devices, from the whole model's counts
    (``profile``, t = 1): model = 3 x forward (Narayanan et al. 2021's convention: backward
    twice the forward), hardware = model + the forward of every recomputed stage again."""
    u = float(plan.micro_batch_size)
    per_sample = [b.forward_flops(u) / u for b in profile.blocks]
    batch = plan.batch_size * plan.data_parallel
    model = 3.0 * sum(per_sample) * batch
    again = sum(per_sample[i] for s in plan.stages if s.recompute for i in s.block_indices) * batch
    return model, model + again


def _no_layout(request: ParallelRequest, rejected: list[Rejected]) -> PlanError:
    pinned = next((r.reason for r in rejected if r.reason.startswith(("--sharding", "--shard-group"))), None)
    if pinned is not None:  # the user's pin ruled the splits out: that is the line to read
        return PlanError(f"{pinned}; pin another or leave it to the search")
    deepest = max(rejected, key=lambda r: r.stages, default=None)
    hint = f"; the deepest pipeline (S={deepest.stages}): {deepest.reason}" if deepest else ""
    return InfeasibleError(
        f"no split of {request.cluster.devices} devices into tensor x pipeline x data parallel fits "
        f"{format_bytes(request.memory_limit)} per device"
        f"{hint}"
    )
