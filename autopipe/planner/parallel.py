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

**Context and expert parallelism** (given ``costs.options.ParallelOptions``): each ``t`` is
tried with context parallelism ``cp`` (D = G / (t cp S)) and, for a mixture of experts, each
expert-parallel degree ``ep`` of a stage's t cp D devices, every layout priced once
(``options.price``); the routed experts' state is sharded over their own group, the all-to-all
hidden where the target's schedule hides it, and an ep no faster than a larger one is not
searched (:mod:`autopipe.planner.cluster.experts`). The runner-up differs in the degrees or S.

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
from dataclasses import replace

from autopipe.costs.options import Layout as Degrees
from autopipe.costs.options import ParallelOptions, layout_reason
from autopipe.costs.profile import Profile
from autopipe.costs.tensor import tensor_degrees, tensor_reason
from autopipe.errors import InfeasibleError, PlanError
from autopipe.modes import Sharding
from autopipe.planner.cluster import (
    ParallelOption,
    ParallelPlan,
    ParallelRequest,
    Rejected,
    ShardOption,
    TensorOptions,
    element_bytes,
    group_of,
    least_step_comm,
    shard_options,
    sharded_profile,
    split_options,
    target_overlap,
)
from autopipe.planner.cluster.experts import (
    Unpaired,
    check_expert_pins,
    context_degrees,
    dominated,
    expert_degrees,
    hidden_profile,
    hiding_choices,
)
from autopipe.planner.cluster.split import static_bound, work_bound
from autopipe.planner.cluster.values import Context, Split
from autopipe.planner.placement import Cluster, Layout, layouts, reduce_ratio, ring_allreduce_s
from autopipe.planner.pricing import Schedules
from autopipe.planner.request import divisors
from autopipe.planner.search import Progress, SharedCuts
from autopipe.plans import MAX_MICRO_BATCHES, MAX_REPLICAS, Plan
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


def plan_parallel(
    profile: Profile,
    request: ParallelRequest,
    progress: Progress | None = None,
    tensor: TensorOptions | None = None,
    parallel: ParallelOptions | None = None,
) -> ParallelPlan:
    """The (t, cp, S, D, ep) layout, sharding and pipeline plan with the shortest step that fits
    memory; ``progress(what, done, total)`` is told each search (``plan_pipeline``'s), per layout.
    ``profile`` is the whole model on one device (t = 1); ``tensor`` prices t > 1, ``parallel``
    (``costs.options``) t, cp, ep and etp together (and, given, takes the place of ``tensor``)."""
    G, B = request.cluster.devices, request.global_batch
    if G < 1 or B < 1:
        raise PlanError(f"need at least one device and one sample (got {G} devices, batch {B})")
    if request.stages is not None and (request.stages < 1 or G % request.stages):
        raise PlanError(f"--stages {request.stages} does not divide {G} devices; use a divisor of {G}")
    overlap = target_overlap(request.choices.target, request.overlap)
    sync = schedule_names() if not overlap.p2p else target_spec(request.choices.target).blocking_p2p
    sp = parallel.sequence_parallel if parallel is not None else tensor is not None and tensor.sequence_parallel
    # the target's reduction dtype for bf16 weights (Target.grad_reduce_fp32), unless the request pins it
    fp32 = request.grad_reduce_fp32
    if fp32 is None:
        fp32 = target_spec(request.choices.target).grad_reduce_fp32 and profile.dtype == "bfloat16"
    ratio = reduce_ratio(element_bytes(profile), fp32)
    ctx = Context(request, overlap, tuple(sync), sp, Schedules(), progress, set(), SharedCuts(), reduce_ratio=ratio)
    if parallel is not None:
        tensor = TensorOptions(parallel.tensor, lambda t: parallel.price(Degrees(t)), parallel.sequence_parallel)
    check_expert_pins(parallel, request.expert_parallel, request.expert_tensor_parallel)
    degrees, skipped = _degrees(request, tensor)
    rejected = [Rejected(0, 0, why, tensor_parallel=t) for t, why in skipped]
    candidates = _candidates(profile, ctx, degrees, tensor, parallel, rejected)
    candidates.sort(key=Split.key)
    options: list[ParallelOption] = []
    pruned = 0
    for c in candidates:
        target = _runner_up_step(options)
        if c.bound * (1 - 1e-9) >= target:
            pruned += 1
            continue
        beat = min([target] + [o.step_time_s for o in options if _key(o) == _split_key(c)])
        found_options = split_options(c, ctx, rejected, beat)
        pruned += found_options is None
        options.extend(found_options or [])
    if not options:
        raise _no_layout(request, rejected)
    options = _simplest(options)
    best = options[0]
    if (_split_of(best), best.sharding) in ctx.partial:  # again, alone and in full, for the plan's runners-up
        searched = next(c for c in candidates if c.name == _split_of(best) and best.sharding in c.options)
        alone = replace(searched, options=(best.sharding,))
        again = [o for o in split_options(alone, ctx, [], math.inf) or [] if o.layout == best.layout]
        options = _simplest([o for o in options if o is not best] + again)
    best = options[0]
    runner_up = next((o for o in options if _key(o) != _key(best)), None)
    note = f"chose {best.describe()}; runner-up: {runner_up.describe() if runner_up else 'none fits'}"
    flops = model_flops(profile, best.plan)
    best = replace(best, plan=replace(best.plan, parallel_note=note, model_flops=flops[0], hardware_flops=flops[1]))
    return ParallelPlan(best, runner_up, tuple(rejected), pruned)


def _candidates(
    profile: Profile,
    ctx: Context,
    degrees: list[int],
    tensor: TensorOptions | None,
    parallel: ParallelOptions | None,
    rejected: list[Rejected],
) -> list[Split]:
    """The queue: every (t, cp, S, D, ep, etp) split whose state can fit, each layout priced once;
    the splits with no plan told in ``rejected``."""
    request, G = ctx.request, ctx.request.cluster.devices
    out: list[Split] = []
    for t in degrees:
        cps, _ = context_degrees(parallel, G, t, request.context_parallel)  # the skipped ones: not said per plan
        for cp in cps:
            width = G // (t * cp)
            for S in [request.stages] if request.stages else divisors(width):
                if width % S:
                    by = f"t={t}" if cp == 1 else f"(t={t} x cp={cp})"
                    rejected.append(Rejected(S, 0, f"{S} stages do not divide {width} = {G} devices / {by}", None, t))
                    continue
                D = width // S
                pinned = (request.expert_parallel, request.expert_tensor_parallel)
                experts = expert_degrees(parallel, t, cp, t * cp * D, pinned)
                if not experts:
                    rejected.append(Rejected(S, D, _expert_reason(parallel, t, cp, t * cp * D, pinned), None, t))
                priced = []
                for ep, etp in experts:
                    lay = Degrees(t, cp, ep, etp)
                    if parallel is not None and (parallel.experts is not None or lay != Degrees(t)):
                        priced.append((lay, parallel.price(lay)))
                    else:
                        priced.append((lay, profile if t == 1 else tensor.price(t)))  # type: ignore[union-attr]
                out += _expert_splits(priced, ctx, parallel, S, D, rejected)
    return out


def _expert_splits(
    priced: list[tuple[Degrees, Profile]],
    ctx: Context,
    parallel: ParallelOptions | None,
    S: int,
    D: int,
    rejected: list[Rejected],
) -> list[Split]:
    """The queue items of one (t, cp, S, D) with each priced (ep, etp), open and, where the target
    hides it, with the all-to-all hidden; those another ep dominates left out (``dominated``)."""
    sizes = _sizes(ctx.request, D)
    opened: list[Split] = []
    hidden: list[Split] = []
    for lay, prof in priced:
        found, why = _splits(prof, ctx, lay, S, D)
        if why:
            rejected.append(Rejected(S, D, why, tensor_parallel=lay.t))
        opened += found
        hidden += _hiding(found, ctx, parallel)
    if len(priced) < 2:
        return opened + hidden
    out = []
    for group in (opened, hidden):
        pairs = [(c.degrees, c.hidden or c.profile) for c in group]
        out += [c for i, c in enumerate(group) if i not in dominated(pairs, sizes)]
    return out


def _sizes(request: ParallelRequest, D: int) -> list[float]:
    """The micro-batch sizes a replica's share of ``request``'s batch can be split into."""
    U = request.global_batch // D
    m = request.choices.micro_batches
    return [U / m] if m else [U / k for k in divisors(U) if k <= MAX_MICRO_BATCHES]


def _expert_reason(
    parallel: ParallelOptions | None, t: int, cp: int, stage: int, pinned: tuple[int | None, int | None]
) -> str:
    """Why no (ep, etp) applies to a stage of ``stage`` devices (the pinned ones' reason)."""
    ep, etp = pinned[0] or 1, pinned[1] or 1
    if parallel is None:
        return "--expert-parallel needs an analytic plan of a model with routed experts"
    why = layout_reason(parallel, Degrees(t, cp, ep, etp), stage)
    return f"--expert-parallel {ep} x --expert-tensor-parallel {etp}: {why or 'no degree applies'}"


def _hiding(found: list[Split], ctx: Context, parallel: ParallelOptions | None) -> list[Split]:
    """``found``'s split again with the expert all-to-all hidden, where the target hides it."""
    if parallel is None or not found or found[0].degrees.ep * found[0].degrees.etp == 1:
        return []
    c = found[0]
    choices = hiding_choices(ctx.request.choices, c.S)
    if choices is None:
        return []
    alone = None  # Megatron-Core's warm-up and cool-down chunks run unpaired (experts.Unpaired)
    if choices.schedule == "interleaved-1f1b":
        alone = Unpaired.interleaved(c.S, choices.virtual, ctx.request.global_batch, c.D)
    counts = (round(alone.warmup), round(alone.chunks)) if alone is not None else (0, 0)
    key = (id(c.profile), "hidden", *counts)  # one hidden profile per priced one and unpaired share, kept with it
    if key not in ctx.states or ctx.states[key][0] is not c.profile:
        lay = c.degrees
        hidden = hidden_profile(c.profile, lambda u: parallel.alltoall(lay, u), parallel.alltoall_share, alone)
        ctx.states[key] = (c.profile, hidden or c.profile, 0.0)
    kept, hidden, _ = ctx.states[key]
    if hidden is kept:
        return []
    bound = min(_bound(hidden, ctx, c.t, c.S, c.D, o, c.lays(ctx)) for o in c.options)
    return [replace(c, bound=bound, estimate=c.estimate - c.bound + bound, hidden=hidden, hidden_choices=choices)]


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


def _splits(profile: Profile, ctx: Context, deg: Degrees, S: int, D: int) -> tuple[list[Split], str]:
    """The queue item of (t, cp, S, D, ep, etp), its shardings whose state can fit, searched
    together; or why there is none."""
    request = ctx.request
    why = _cannot(profile, request, S, D)
    if why is not None:
        return [], why
    pinned = Sharding.ZERO1 if request.shard_optimizer and request.sharding is None else request.sharding
    options, why = shard_options(request.choices.target, S, D, pinned, request.shard_group)
    t = deg.t
    lays = layouts(S, D, request.cluster, t, deg.cp)
    fitting = []
    for option in options:
        need = static_bound(profile, request, S, lays, option, deg, ctx)
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
    least = min(fitting, key=lambda o: static_bound(profile, request, S, lays, o, deg, ctx))
    estimate = _estimate(profile, ctx, S, D, bound, lays, least, deg)
    return [Split(estimate, bound, t, S, D, tuple(fitting), profile, deg)], ""


def _bound(profile: Profile, ctx: Context, t: int, S: int, D: int, o: ShardOption, lays: Sequence[Layout]) -> float:
    """A lower bound on the step of any plan of (t, S, D) under ``o``, whatever its layout,
    schedule and cuts: :func:`work_bound` of the blocks with the fastest link's collectives,
    plus the least the once-a-step collectives add."""
    cluster = ctx.request.cluster
    groups = [g for lay in lays if (g := group_of(o, lay, cluster, ctx.reduce_ratio)) is not None]
    if not groups:
        return math.inf
    fastest = max(groups, key=lambda g: g.inner_bandwidth)
    work = work_bound(sharded_profile(profile, o.kind, fastest, ctx.overlap), ctx, S, D)
    return work + min(least_step_comm(profile, S, o.kind, g, ctx.overlap) for g in groups)


def _degrees_of(option: ParallelOption) -> Degrees:
    lay = option.layout
    return Degrees(lay.tensor_parallel, lay.context_parallel, lay.expert_parallel, lay.expert_tensor_parallel)


def _key(option: ParallelOption) -> tuple[Degrees, int]:
    """What a runner-up differs in: the degrees or the pipeline depth."""
    return _degrees_of(option), option.layout.stages


def _split_key(c: Split) -> tuple[Degrees, int]:
    return c.degrees, c.S


def _split_of(option: ParallelOption) -> tuple[Degrees, int, int, bool]:
    """The :attr:`Split.name` of the split ``option`` came from."""
    return _degrees_of(option), option.layout.stages, option.layout.data_parallel, option.plan.overlap.expert_comm


def _order(option: ParallelOption) -> tuple[float, int, int, int, int, int, str, tuple[int, bool]]:
    lay = option.layout
    return (
        option.step_time_s,
        lay.tensor_parallel,
        lay.context_parallel,
        lay.expert_parallel,
        lay.expert_tensor_parallel,
        lay.stages,
        lay.placement,
        option.sharding.rank(),
    )


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
    """The step of the best plan of another (t, cp, ep, etp, S) than the best's so far (inf: none yet): a
    split that cannot beat it can be neither the best nor the runner-up."""
    ranked = sorted(options, key=_order)
    second = next((o for o in ranked if _key(o) != _key(ranked[0])), None)
    return second.step_time_s if second is not None else math.inf


def _estimate(
    profile: Profile,
    ctx: Context,
    S: int,
    D: int,
    bound: float,
    lays: Sequence[Layout],
    o: ShardOption,
    deg: Degrees,
) -> float:
    """Where to open (t, S, D) in the search (order only, never to skip): its ``bound``, plus
    the forward of every micro-batch again (whole recomputation) when the static bound and
    1F1B's in-flight activations of the smallest micro-batch, min(m, S) of them on a stage,
    exceed the memory limit."""
    request = ctx.request
    U = request.global_batch // D
    m = request.choices.micro_batches or min(U, MAX_MICRO_BATCHES)
    u = U / m
    saved = sum(b.saved_bytes(u) for b in profile.blocks) / S * min(m, S)
    if static_bound(profile, request, S, lays, o, deg, ctx) + saved <= request.memory_limit:
        return bound
    return bound + m * sum(b.forward_s(u) for b in profile.blocks) / S


def model_flops(profile: Profile, plan: Plan) -> tuple[float, float]:
    """(model, hardware) FLOPs of one iteration on all devices, from the whole model's counts
    (``profile``, t = 1): model = 3 x forward (Narayanan et al. 2021's convention: backward
    twice the forward), hardware = model + the forward of every recomputed stage again."""
    u = float(plan.micro_batch_size)
    per_sample = [b.forward_flops(u) / u for b in profile.blocks]
    batch = plan.batch_size * plan.data_parallel
    model = 3.0 * sum(per_sample) * batch
    again = sum(per_sample[i] for s in plan.stages if s.recompute for i in s.block_indices) * batch
    return model, model + again + recomputed_flops(profile, plan) * batch


def recomputed_flops(profile: Profile, plan: Plan) -> float:
    """FLOPs per sample that ``plan``'s uniform memory choice runs again: the counted forward of
    the recomputed module kinds in every layer, or of the first ``recompute_layers`` layers of
    each stage (``costs.activations.choices``)."""
    u = float(plan.micro_batch_size)
    if plan.recompute_modules:
        kinds = tuple(plan.recompute_modules)
        return sum(o.recompute_flops(u) / u for b in profile.blocks for o in b.memory if o.recompute == kinds)
    if plan.recompute_layers:
        firsts = ([i for i in s.block_indices if profile.blocks[i].layer][: plan.recompute_layers] for s in plan.stages)
        return sum(profile.blocks[i].forward_flops(u) / u for first in firsts for i in first)
    return 0.0


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
