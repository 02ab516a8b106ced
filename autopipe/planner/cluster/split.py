"""One (t, S, D) split searched with its shardings: on each layout, each sharding's pipeline
search (its state per parameter, its gathered bytes, its blocks' collectives), a plan reused where
one of a sharding that keeps less fits, and the step with its once-a-step collectives (past the
pipeline, or overlapped on the simulated timeline: ``simulate.overlap``).

Tests: tests/planner/test_parallel.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from autopipe.costs.options import Layout as Degrees
from autopipe.costs.options import expert_gradient_group
from autopipe.costs.profile import Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.modes import Sharding
from autopipe.planner.assemble import plan_comm, plan_costs
from autopipe.planner.cluster.experts import state_profile
from autopipe.planner.cluster.sharding import (
    ShardOption,
    ddp_buckets,
    element_bytes,
    group_of,
    least_step_comm,
    sharded_profile,
    transient,
)
from autopipe.planner.cluster.values import ONE, Context, ParallelOption, ParallelRequest, Rejected, Split
from autopipe.planner.noise import robust_plan
from autopipe.planner.placement import DataGroup, Layout, step_comm
from autopipe.planner.pricing import Schedules
from autopipe.planner.request import divisors, validate
from autopipe.planner.search import PlanRequest, Progress, plan_search
from autopipe.plans import MAX_MICRO_BATCHES, Overlap, Plan
from autopipe.simulate.overlap import chunk_windows, exposed_s
from autopipe.units import format_bytes

__all__ = [
    "data_parallel_s",
    "most_shards",
    "restamp",
    "split_options",
    "static_bound",
    "with_transient",
    "work_bound",
]


def split_options(c: Split, ctx: Context, rejected: list[Rejected], beat: float) -> list[ParallelOption] | None:
    """The plans of ``c``, one per distinct layout and sharding; None when none is faster than
    ``beat`` (a step to beat: the search then stops early, and says no more than that).

    On each layout the shardings whose blocks keep their profiled times go first, the least state
    first: a plan of one that fits another is that one's too (:func:`_reused`). A sharding is not
    searched where its bound, or the pipeline of one that keeps less with the least its own
    collectives add, cannot beat the best so far; nor, in the free search of a pipeline, one that
    gathers or reduces per micro-batch where another fits with nothing recomputed (:func:`_needless`)."""
    request = ctx.request
    out: list[ParallelOption] = []
    plans: dict[tuple[object, ...], Plan | None] = {}  # (link, blocks' times, state, gathered) -> plan
    failed: dict[ShardOption, Exception] = {}
    whole = False  # a sharding with the blocks' own times fits with nothing recomputed
    base = c.hidden or c.profile
    for lay in c.lays(ctx):
        lay = replace(lay, expert_parallel=c.degrees.ep, expert_tensor_parallel=c.degrees.etp)
        link = (lay.p2p_bandwidth, lay.p2p_latency_s)
        for o, group, prof, factor, extra, own in _in_order(c, ctx, lay):
            if o in failed or _needless(o, c, own, request, whole):
                continue
            timed = (link,) if prof is base else (link, o.kind, group)
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
                        ctx.partial.add((c.name, o))
                elif plan is not None:
                    ctx.partial.add((c.name, o))  # its runners-up are another search's
                plans[key] = plan
            plan = plans[key]
            if plan is not None:
                priced = _priced(c.profile, plan, lay, o, group, extra, ctx, c.hidden is not None)
                out.append(ParallelOption(lay, priced, o))
                whole = whole or (own and not any(s.recompute for s in plan.stages))
    if not out and beat == math.inf and failed:
        lays = c.lays(ctx)
        error = failed[min(failed, key=lambda o: static_bound(c.profile, request, c.S, lays, o, c.degrees, ctx))]
        need = error.min_memory_bytes if isinstance(error, InfeasibleError) else None
        rejected.append(Rejected(c.S, c.D, str(error), need, c.t))
    return out if out or beat == math.inf else None


def _in_order(c: Split, ctx: Context, lay: Layout) -> list[tuple[ShardOption, DataGroup, Profile, float, float, bool]]:
    """``c``'s shardings that apply on ``lay``, with their group, blocks, state factor, gathered
    bytes and whether the blocks keep their times (the experts' bytes may be weighted,
    ``cluster.experts.state_profile``): those that keep them first, then by state per parameter
    and gathered bytes."""
    request = ctx.request
    base = c.hidden or c.profile
    out = []
    for o in c.options:
        group = group_of(o, lay, request.cluster, ctx.reduce_ratio)
        if group is None:
            continue
        timed = sharded_profile(base, o.kind, group, ctx.overlap)
        own = timed is base
        keep = ctx if own else None  # the sharded blocks are new each time: not kept
        per_param = request.bytes_per_param
        prof, factor = _state(timed, c.degrees, c.D, o.kind, group.shard, per_param, keep, ctx.reduce_ratio)
        out.append((o, group, prof, factor, transient(c.profile, o.kind), own))
    return sorted(out, key=lambda x: (not x[5], x[3], x[4]))


def _state(
    profile: Profile,
    deg: Degrees,
    D: int,
    kind: Sharding,
    shards: int,
    bytes_per_param: float,
    ctx: Context | None,
    grad_ratio: float = 1.0,
) -> tuple[Profile, float]:
    """``state_profile``, kept in ``ctx`` per profile, sharding and group sizes (``grad_ratio``: the
    gradients' bytes per weight byte, the gradients being kept as wide as they are reduced:
    ``Context.reduce_ratio``)."""
    if ctx is None:
        return state_profile(profile, deg, D, kind, shards, bytes_per_param, grad_ratio)
    key = (id(profile), kind.value, shards * deg.cp, expert_gradient_group(deg, D))
    hit = ctx.states.get(key)
    if hit is None or hit[0] is not profile:
        hit = ctx.states[key] = (profile, *state_profile(profile, deg, D, kind, shards, bytes_per_param, grad_ratio))
    return hit[1], hit[2]


def _needless(o: ShardOption, c: Split, own: bool, request: ParallelRequest, whole: bool) -> bool:
    """Whether the free search leaves out ``o``, a sharding whose blocks gather or reduce each
    micro-batch (not hidden) on a pipeline, because one with the blocks' own times already fits with
    nothing recomputed (``whole``): the memory it frees is not worth a collective per block and
    micro-batch. (Pinned, or without a pipeline, it is searched.)"""
    pinned = request.sharding is not None or request.shard_optimizer
    if pinned or own or c.S == 1:
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
    c: Split, ctx: Context, lay: Layout, profile: Profile, factor: float, extra: float, incumbent: float, least: float
) -> Plan:
    """The pipeline plan of ``lay`` for ``profile`` (with its sharding's collectives), ``factor``
    bytes of state per parameter byte and ``extra`` bytes gathered on every device; InfeasibleError
    where none fits, or none whose step can beat ``incumbent`` (the collectives add at least ``least``)."""
    request = ctx.request
    choices = c.hidden_choices or request.choices
    if work_bound(profile, ctx, c.S, c.D) + least >= incumbent * (1 + 1e-9):
        raise InfeasibleError("no plan faster than the step to beat")
    req = PlanRequest(
        devices=lay.stages,
        batch_size=request.global_batch // lay.data_parallel,
        memory_limit=request.memory_limit - extra,
        micro_batches=choices.micro_batches,
        schedule=choices.schedule,
        virtual=choices.virtual,
        recompute=choices.recompute,
        target=choices.target,
        link_bandwidth=lay.p2p_bandwidth,
        link_latency_s=lay.p2p_latency_s,
        state_factor=factor,
        alternatives=request.alternatives,
        action_overhead_s=request.action_overhead_s,
        send_overhead_s=request.send_overhead_s,
        blocking_sends=ctx.blocking,
        recompute_modules=choices.recompute_modules,
        recompute_layers=choices.recompute_layers,
        offload_modules=choices.offload_modules,
        host_bandwidth=request.host_bandwidth,
    )
    if req.memory_limit <= 0:
        raise InfeasibleError(f"the gathered weights and gradients alone take {format_bytes(extra)} per device")
    progress = ctx.progress
    d = c.degrees
    said = f"t={c.t}{f' x cp={d.cp}' if d.cp > 1 else ''} x S={c.S} x D={c.D}"
    said += f" x ep={d.ep}{f' x etp={d.etp}' if d.etp > 1 else ''}" if d.ep * d.etp > 1 else ""
    told = None if progress is None else _labelled(progress, f"{said}: ")
    validate(profile, req)
    return robust_plan(profile, req, plan_search(profile, req, told, incumbent - least, ctx.cuts))


def _labelled(progress: Progress, label: str) -> Progress:
    return lambda what, done, total: progress(label + what, done, total)


def _priced(
    profile: Profile,
    plan: Plan,
    lay: Layout,
    o: ShardOption,
    group: DataGroup,
    extra: float,
    ctx: Context,
    hidden: bool = False,
) -> Plan:
    """``plan`` as one of D replicas: the gathered state back in its memory, the once-a-step
    collectives in its step, the sharding and overlaps it was priced with."""
    request, D = ctx.request, lay.data_parallel
    sharded = o.kind if D > 1 else Sharding.NONE
    plan = replace(
        with_transient(plan, extra, request.memory_limit),
        overlap=replace(ctx.overlap, p2p=plan.schedule not in ctx.blocking, expert_comm=hidden),
    )
    exposed, whole = data_parallel_s(plan, sharded, group, element_bytes(profile), ctx.overlap, ctx.schedules)
    step = plan.iteration_time_s + exposed
    return replace(
        plan,
        data_parallel=D,
        allreduce_s=exposed,
        dp_comm_s=whole,
        grad_reduce_ratio=group.reduce_ratio if D > 1 else 1.0,
        throughput=request.global_batch / step if step > 0 else math.inf,
        link_bandwidth=lay.p2p_bandwidth,
        tensor_parallel=lay.tensor_parallel,
        sequence_parallel=ctx.sequence_parallel and lay.tensor_parallel > 1,
        shard_optimizer=sharded != Sharding.NONE,
        sharding=sharded,
        shard_group=group.shard if group.shard < D else 0,
        context_parallel=lay.context_parallel,
        expert_parallel=lay.expert_parallel,
        expert_tensor_parallel=lay.expert_tensor_parallel,
    )


def most_shards(option: ShardOption, lays: Sequence[Layout]) -> int:
    return max((n for lay in lays if (n := option.shards(lay)) is not None), default=0)


def static_bound(
    profile: Profile,
    request: ParallelRequest,
    S: int,
    lays: Sequence[Layout],
    o: ShardOption,
    deg: Degrees = ONE,
    ctx: Context | None = None,
) -> float:
    """Bytes some device of an S-stage pipeline holds at least under ``o``, before any activation
    (the routed experts' state over their own group: ``cluster.experts.state_profile``)."""
    shards = most_shards(o, lays)
    if not shards:
        return math.inf
    D = lays[0].data_parallel
    ratio = ctx.reduce_ratio if ctx is not None else 1.0
    state, factor = _state(profile, deg, D, o.kind, shards, request.bytes_per_param, ctx, ratio)
    per_block = [(b.param_bytes + b.shared_param_bytes) * factor for b in state.blocks]
    return max(sum(per_block) / S, max(per_block, default=0.0)) + transient(profile, o.kind)


def work_bound(profile: Profile, ctx: Context, S: int, D: int) -> float:
    """A lower bound on the pipeline of any plan of S stages for D replicas: for the best micro-batch
    count m (size u = U / m of the replica's share U), the larger of the busiest device's work, at
    least the average m (F + B)(u) / S, and micro-batch 0's chain forward through every block and
    back (input gradients). Recomputation and hops only add. Kept per profile in ``ctx``."""
    key = (id(profile), S, D)
    hit = ctx.bounds.get(key)
    if hit is not None and hit[0] is profile:
        return hit[1]
    request = ctx.request
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
    ctx.bounds[key] = (profile, best)  # the profile kept alive with its id
    return best


def data_parallel_s(
    plan: Plan, kind: Sharding, group: DataGroup, element: float, overlap: Overlap, schedules: Schedules
) -> tuple[float, float]:
    """(past the pipeline, in all) seconds of ``plan``'s once-a-step data-parallel collectives on
    its busiest device: serial, each device's chunks as one collective after its pipeline (or
    before, the gathers); overlapped, chunk by chunk on the simulated timeline (``simulate.overlap``)."""
    if group.replicas == 1:
        return 0.0, 0.0
    per_device: dict[int, float] = {}
    for s in plan.stages:
        per_device[s.rank] = per_device.get(s.rank, 0.0) + s.params * element
    whole = max(sum(step_comm(kind, group, nbytes)) for nbytes in per_device.values())
    if not (overlap.grad_reduce or overlap.param_gather):
        return whole, whole
    chunks = [step_comm(kind, group, s.params * element) for s in plan.stages]
    compiled = schedules.compiled(plan.schedule, plan.devices, plan.micro_batches, plan.virtual)
    windows = chunk_windows(compiled, plan_costs(plan), plan_comm(plan))
    reduce, gather = [c[0] for c in chunks], [c[1] for c in chunks]
    out = exposed_s(
        windows,
        reduce,
        gather,
        overlap_reduce=overlap.grad_reduce,
        overlap_gather=overlap.param_gather,
        buckets=ddp_buckets(plan, kind, group.replicas),
    )
    if not overlap.grad_reduce:  # the serial part as one collective per device, as above
        out = max(out, max(step_comm(kind, group, nbytes)[0] for nbytes in per_device.values()))
    return out, whole


def restamp(plan: Plan, ratio: float, limit: float) -> Plan | None:
    """``plan`` with every device's state ``ratio`` times as large (a sharding that keeps more per
    parameter), or None where that does not fit ``limit``: the same cuts are then the best of the
    sharding that keeps more, since whatever fits it fits the one that keeps less."""
    extra = [0.0] * plan.devices
    for s in plan.stages:
        extra[s.rank] += s.static_bytes * (ratio - 1.0)
    peak = tuple(p + e for p, e in zip(plan.peak_memory_bytes, extra, strict=True))
    if any(p > limit * (1 + 1e-12) for p in peak):
        return None
    stages = tuple(
        replace(s, static_bytes=s.static_bytes * ratio, memory_bytes=s.memory_bytes + s.static_bytes * (ratio - 1.0))
        for s in plan.stages
    )
    most = max(extra, default=0.0)
    baselines = tuple(
        replace(
            b,
            peak_memory_bytes=tuple(p + e for p, e in zip(b.peak_memory_bytes, extra, strict=True)),
            fits=all(p + e <= limit for p, e in zip(b.peak_memory_bytes, extra, strict=True)),
        )
        for b in plan.baselines
    )
    alternatives = tuple(replace(a, peak_memory_bytes=a.peak_memory_bytes + most) for a in plan.alternatives)
    alternatives = tuple(a for a in alternatives if a.peak_memory_bytes <= limit)
    return replace(plan, stages=stages, peak_memory_bytes=peak, baselines=baselines, alternatives=alternatives)


def with_transient(plan: Plan, nbytes: float, limit: float) -> Plan:
    """``plan`` (searched within ``limit - nbytes``) with ``nbytes`` more on every device, and ``limit``."""
    if nbytes == 0.0 and plan.memory_limit_bytes == limit:
        return plan
    return replace(
        plan,
        memory_limit_bytes=limit,
        peak_memory_bytes=tuple(p + nbytes for p in plan.peak_memory_bytes),
        stages=tuple(replace(s, memory_bytes=s.memory_bytes + nbytes) for s in plan.stages),
        baselines=tuple(
            replace(b, peak_memory_bytes=tuple(p + nbytes for p in b.peak_memory_bytes)) for b in plan.baselines
        ),
        alternatives=tuple(replace(a, peak_memory_bytes=a.peak_memory_bytes + nbytes) for a in plan.alternatives),
    )
