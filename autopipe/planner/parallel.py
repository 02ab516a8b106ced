"""Tensor x pipeline x data parallel: split G devices into t-wide groups, S stages, D replicas.

Tensor parallelism (Megatron-LM: Shoeybi et al. 2019; Narayanan et al. 2021) splits every
transformer layer over ``t`` devices of one node (``t`` divides the devices per node, the
attention heads and the key/value heads); its per-device costs, collectives and memory are
priced by ``costs.tensor`` and handed here as one profile per ``t`` (:class:`TensorOptions`;
without it, ``t = 1``). For every ``t`` and pipeline depth S with ``t * S`` dividing G, and
D = G / (t S), each replica trains ``global_batch / D`` samples per iteration; the pipeline
planner (:func:`~autopipe.planner.search.plan_pipeline`) chooses cuts, micro-batches, schedule,
virtual stages and recomputation for that share, and the step ends with each stage's ring
all-reduce of its gradients among its D replicas (Patarasuk & Yuan 2009), each device of a
group reducing its own 1/t shard over its own link::

    allreduce_s = 2 (D - 1) / D * gradient_bytes / bandwidth + 2 (D - 1) * latency
    step_s      = simulated pipeline iteration + max over ranks of allreduce_s

(after the pipeline flush, no overlap: an upper bound). Where the ranks go and what the hops
and the all-reduce cost: :mod:`autopipe.planner.placement`. Memory per device: ``bytes_per_param``
per parameter (16 for Adam in mixed precision or fp32, see ``costs.analytic``), or with
``shard_optimizer`` (ZeRO stage 1, Rajbhandari et al. 2020) the weights and gradients whole
and the rest split D ways.

The search is exact and pruned. A (t, S, D) whose lower bound on the step (:func:`_bound`)
is not below the runner-up so far is skipped; the others are searched with the runner-up as
the time to beat (``plan_search``'s ``incumbent``, less the least all-reduce the split can
have), so a pipeline search stops as soon as its own bounds say it cannot place second.
Splits are opened likeliest first (:func:`_estimate`: the bound, plus a whole recomputation
where even one stage's weights and 1F1B's in-flight activations cannot fit), so the runner-up
comes early; the best is searched again in full when it was searched against an incumbent
(its plan lists its own runners-up). The result is the best layout and the runner-up with
another (t, S); pure: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from autopipe.costs.profile import Profile
from autopipe.costs.tensor import TransformerShape, tensor_degrees, tensor_reason
from autopipe.errors import InfeasibleError, PlanError
from autopipe.planner.noise import robust_plan
from autopipe.planner.placement import Cluster, Layout, layouts, ring_allreduce_s
from autopipe.planner.request import NO_CHOICES, Choices, divisors, validate
from autopipe.planner.search import PlanRequest, Progress, plan_search
from autopipe.plans import MAX_MICRO_BATCHES, MAX_REPLICAS, Plan
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
class TensorOptions:
    """Tensor parallelism for :func:`plan_parallel`: the model's structure and its profile
    priced for one device of a t-wide group (``costs.analytic.profile_from_counts``)."""

    shape: TransformerShape | None
    price: Callable[[int], Profile]  # t -> one device's profile at degree t
    sequence_parallel: bool = True


@dataclass(frozen=True)
class ParallelRequest:
    """What to plan: the planner's own choices may be pinned as in ``PlanRequest``."""

    cluster: Cluster
    global_batch: int  # samples per iteration over all replicas
    memory_limit: float  # bytes per device
    bytes_per_param: float = 16.0  # weights + grads + optimizer state, per parameter
    shard_optimizer: bool = False  # ZeRO-1: optimizer state (and master weights) split D ways
    stages: int | None = None  # pin S, the pipeline depth
    choices: Choices = NO_CHOICES  # pinned micro-batches (per replica), schedule, v, recomputation
    alternatives: int = 5
    action_overhead_s: float = 0.0  # the executor's cost per action (PlanRequest's)
    tensor_parallel: int | None = None  # pin t
    data_parallel: int | None = None  # pin D
    host_bandwidth: float = 0.0  # bytes/s to the host per device (activation offload; PlanRequest's)


@dataclass(frozen=True)
class ParallelOption:
    layout: Layout
    plan: Plan  # data_parallel and allreduce_s filled in

    @property
    def step_time_s(self) -> float:
        return self.plan.step_time_s

    def describe(self) -> str:
        lay, p = self.layout, self.plan
        return (
            f"t={lay.tensor_parallel} x S={lay.stages} x D={lay.data_parallel} ({lay.placement}): "
            f"{p.schedule}, m={p.micro_batches}, "
            f"step {_seconds(p.step_time_s)} (pipeline {_seconds(p.iteration_time_s)} "
            f"+ all-reduce {_seconds(p.allreduce_s)})"
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
    pruned: int = 0  # (t, S, D) skipped because their bound could not beat the runner-up

    @property
    def plan(self) -> Plan:
        return self.best.plan


def plan_parallel(
    profile: Profile, request: ParallelRequest, progress: Progress | None = None, tensor: TensorOptions | None = None
) -> ParallelPlan:
    """The (t, S, D) layout and pipeline plan with the shortest step that fits memory;
    ``progress(what, done, total)`` is told each search (``plan_pipeline``'s), per layout.
    ``profile`` is the whole model on one device (t = 1); ``tensor`` prices t > 1."""
    G, B = request.cluster.devices, request.global_batch
    if G < 1 or B < 1:
        raise PlanError(f"need at least one device and one sample (got {G} devices, batch {B})")
    if request.stages is not None and (request.stages < 1 or G % request.stages):
        raise PlanError(f"--stages {request.stages} does not divide {G} devices; use a divisor of {G}")
    degrees, skipped = _degrees(request, tensor)
    rejected = [Rejected(0, 0, why, tensor_parallel=t) for t, why in skipped]
    candidates = []
    for t in degrees:
        prof = profile if t == 1 else tensor.price(t)  # type: ignore[union-attr]
        for S in [request.stages] if request.stages else divisors(G // t):
            if (G // t) % S:
                rejected.append(
                    Rejected(S, 0, f"{S} stages do not divide {G // t} = {G} devices / t={t}", tensor_parallel=t)
                )
                continue
            D = G // (t * S)
            why = _cannot(prof, request, t, S, D)
            if why is not None:
                rejected.append(Rejected(S, D, why, tensor_parallel=t))
                continue
            bound = _bound(prof, request, t, S, D)
            candidates.append((_estimate(prof, request, S, D, bound), bound, t, S, D, prof))
    candidates.sort(key=lambda c: c[:5])
    options: list[ParallelOption] = []
    pruned, against = 0, set()  # against: the (t, S) searched with a time to beat
    sp = tensor is not None and tensor.sequence_parallel
    for _, bound, t, S, D, prof in candidates:
        target = _runner_up_step(options)
        if bound * (1 - 1e-9) >= target:
            pruned += 1
            continue
        found = _options(prof, request, t, S, D, progress, rejected, sp, target)
        pruned += found is None
        options.extend(found or [])
        against |= {(t, S)} if target < math.inf else set()
    if not options:
        raise _no_layout(request, rejected)
    options.sort(key=_order)
    if _key(options[0]) in against:  # searched against a time to beat: again in full, for its runners-up
        t, S, D = options[0].layout.tensor_parallel, options[0].layout.stages, options[0].layout.data_parallel
        prof = next(c[5] for c in candidates if c[2:5] == (t, S, D))
        options = [o for o in options if _key(o) != (t, S)] + (_options(prof, request, t, S, D, None, [], sp) or [])
        options.sort(key=_order)
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


def _cannot(profile: Profile, request: ParallelRequest, t: int, S: int, D: int) -> str | None:
    """Why (t, S, D) has no plan before any search, or None."""
    B = request.global_batch
    if request.data_parallel is not None and D != request.data_parallel:
        return f"data-parallel width {D}, pinned to {request.data_parallel}"
    if S > profile.num_blocks:
        return f"{S} stages but the model has {profile.num_blocks} blocks"
    if B % D:
        return f"global batch {B} does not split into {D} equal replicas"
    if D > MAX_REPLICAS:
        return f"{D} replicas, more than autopipe plans (at most {MAX_REPLICAS} = 2**20)"
    static = _static_bound(profile, request, S, D)
    if static > request.memory_limit:
        return (
            f"needs at least {format_bytes(static, round_up=True)} per device "
            "for weights, gradients and optimizer state"
        )
    return None


def _bound(profile: Profile, request: ParallelRequest, t: int, S: int, D: int) -> float:
    """A lower bound on the step of any plan of (t, S, D), whatever its schedule and cuts: for
    the best micro-batch count m (size u = U / m of the replica's share U), the larger of the
    busiest device's work, at least the average m (F + B)(u) / S, and micro-batch 0's chain
    forward through every block and back (input gradients); plus the average stage's gradient
    all-reduce on the fastest link the layouts offer. Recomputation and hops only add."""
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
    grads = sum(b.param_bytes for b in profile.blocks) / S
    fastest = max(lay.allreduce_bandwidth for lay in layouts(S, D, request.cluster, t))
    return best + ring_allreduce_s(grads, D, fastest)


def _key(option: ParallelOption) -> tuple[int, int]:
    return option.layout.tensor_parallel, option.layout.stages


def _order(option: ParallelOption) -> tuple[float, int, int, str]:
    lay = option.layout
    return option.step_time_s, lay.tensor_parallel, lay.stages, lay.placement


def _runner_up_step(options: list[ParallelOption]) -> float:
    """The step of the best plan of another (t, S) than the best's so far (inf: none yet): a
    split that cannot beat it can be neither the best nor the runner-up."""
    ranked = sorted(options, key=_order)
    second = next((o for o in ranked if _key(o) != _key(ranked[0])), None)
    return second.step_time_s if second is not None else math.inf


def _estimate(profile: Profile, request: ParallelRequest, S: int, D: int, bound: float) -> float:
    """Where to open (t, S, D) in the search (order only, never to skip): its ``bound``, plus
    the forward of every micro-batch again (whole recomputation) when the static bound and
    1F1B's in-flight activations of the smallest micro-batch, min(m, S) of them on a stage,
    exceed the memory limit."""
    U = request.global_batch // D
    m = request.choices.micro_batches or min(U, MAX_MICRO_BATCHES)
    u = U / m
    saved = sum(b.saved_bytes(u) for b in profile.blocks) / S * min(m, S)
    if _static_bound(profile, request, S, D) + saved <= request.memory_limit:
        return bound
    return bound + m * sum(b.forward_s(u) for b in profile.blocks) / S


def _options(
    profile: Profile,
    request: ParallelRequest,
    t: int,
    S: int,
    D: int,
    progress: Progress | None,
    rejected: list[Rejected],
    sp: bool,
    target: float = math.inf,
) -> list[ParallelOption] | None:
    """The plans of (t, S, D), one per distinct layout; None when none is faster than ``target``
    (a step to beat: the search then stops early, and says no more than that)."""
    out: list[ParallelOption] = []
    plans: dict[tuple[float, float], Plan | None] = {}
    for lay in layouts(S, D, request.cluster, t):
        link = (lay.p2p_bandwidth, lay.p2p_latency_s)
        req = _pipeline_request(profile, request, lay)
        incumbent = target - _least_allreduce(profile, lay)
        try:
            if link not in plans:
                told = None if progress is None else _labelled(progress, f"t={t} x S={S} x D={D}: ")
                validate(profile, req)
                fitting = plan_search(profile, req, told, incumbent)
                plans[link] = robust_plan(profile, req, fitting)
        except InfeasibleError as e:
            if target < math.inf:  # nothing fits faster than the incumbent: not this layout
                plans[link] = None
                continue
            rejected.append(Rejected(S, D, str(e), e.min_memory_bytes, t))
            break
        except PlanError as e:
            rejected.append(Rejected(S, D, str(e), None, t))
            break
        plan = plans[link]
        if plan is not None:
            out.append(ParallelOption(lay, _with_allreduce(profile, plan, lay, request, sp)))
    return out if out or target == math.inf else None


def _least_allreduce(profile: Profile, lay: Layout) -> float:
    """The all-reduce no cuts of ``lay``'s pipeline avoid: the average stage's gradients."""
    grads = sum(b.param_bytes for b in profile.blocks) / lay.stages
    return ring_allreduce_s(grads, lay.data_parallel, lay.allreduce_bandwidth, lay.allreduce_latency_s)


def _labelled(progress: Progress, label: str) -> Progress:
    return lambda what, done, total: progress(label + what, done, total)


def _state_factor(profile: Profile, request: ParallelRequest, D: int) -> float:
    params = sum(b.params for b in profile.blocks)
    nbytes = sum(b.param_bytes for b in profile.blocks)
    elt = nbytes / params if params else 4.0
    per_param = request.bytes_per_param
    if request.shard_optimizer:
        per_param = 2 * elt + (per_param - 2 * elt) / D  # weights and grads whole, the rest split
    return per_param / elt


def _static_bound(profile: Profile, request: ParallelRequest, S: int, D: int) -> float:
    """Bytes some device of an S-stage pipeline holds at least, before any activation."""
    factor = _state_factor(profile, request, D)
    per_block = [(b.param_bytes + b.shared_param_bytes) * factor for b in profile.blocks]
    return max(sum(per_block) / S, max(per_block, default=0.0))


def _pipeline_request(profile: Profile, request: ParallelRequest, lay: Layout) -> PlanRequest:
    return PlanRequest(
        devices=lay.stages,
        batch_size=request.global_batch // lay.data_parallel,
        memory_limit=request.memory_limit,
        micro_batches=request.choices.micro_batches,
        schedule=request.choices.schedule,
        virtual=request.choices.virtual,
        recompute=request.choices.recompute,
        target=request.choices.target,
        link_bandwidth=lay.p2p_bandwidth,
        link_latency_s=lay.p2p_latency_s,
        state_factor=_state_factor(profile, request, lay.data_parallel),
        alternatives=request.alternatives,
        action_overhead_s=request.action_overhead_s,
        recompute_modules=request.choices.recompute_modules,
        recompute_layers=request.choices.recompute_layers,
        offload_modules=request.choices.offload_modules,
        host_bandwidth=request.host_bandwidth,
    )


def _with_allreduce(profile: Profile, plan: Plan, lay: Layout, request: ParallelRequest, sp: bool) -> Plan:
    params = sum(b.params for b in profile.blocks)
    elt = sum(b.param_bytes for b in profile.blocks) / params if params else 4.0
    per_rank = [0.0] * lay.stages
    for s in plan.stages:
        per_rank[s.rank] += s.params * elt  # gradients in the parameters' dtype
    allreduce = max(
        ring_allreduce_s(g, lay.data_parallel, lay.allreduce_bandwidth, lay.allreduce_latency_s) for g in per_rank
    )
    step = plan.iteration_time_s + allreduce
    return replace(
        plan,
        data_parallel=lay.data_parallel,
        allreduce_s=allreduce,
        throughput=request.global_batch / step if step > 0 else math.inf,
        link_bandwidth=lay.p2p_bandwidth,
        tensor_parallel=lay.tensor_parallel,
        sequence_parallel=sp and lay.tensor_parallel > 1,
        shard_optimizer=request.shard_optimizer and lay.data_parallel > 1,
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
    deepest = max(rejected, key=lambda r: r.stages, default=None)
    hint = f"; the deepest pipeline (S={deepest.stages}): {deepest.reason}" if deepest else ""
    return InfeasibleError(
        f"no split of {request.cluster.devices} devices into tensor x pipeline x data parallel fits "
        f"{format_bytes(request.memory_limit)} per device"
        f"{hint}"
    )
