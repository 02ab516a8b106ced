"""Tensor x pipeline x data parallel: split G devices into t-wide groups, S stages, D replicas.

Tensor parallelism (Megatron-LM: Shoeybi et al. 2019; Narayanan et al. 2021) splits every
transformer layer over ``t`` devices of one node (``t`` divides the devices per node, the
attention heads and the key/value heads); its per-device costs, collectives and memory are
priced by ``costs.tensor`` and handed here as one profile per ``t`` (:class:`TensorOptions`;
without it, ``t = 1``). For every ``t`` and pipeline depth S with ``t * S`` dividing G, and
D = G / (t S), each replica trains ``global_batch / D`` samples per iteration; the pipeline
planner (:func:`~autopipe.solve.search.plan_pipeline`) chooses cuts, micro-batches, schedule,
virtual stages and recomputation for that share, and the step ends with each stage's ring
all-reduce of its gradients among its D replicas (Patarasuk & Yuan 2009), each device of a
group reducing its own 1/t shard over its own link::

    allreduce_s = 2 (D - 1) / D * gradient_bytes / bandwidth + 2 (D - 1) * latency
    step_s      = simulated pipeline iteration + max over ranks of allreduce_s

(after the pipeline flush, no overlap: an upper bound). Between stages each of the t devices
sends its 1/t of the activation (sequence parallelism, or Megatron's scatter/gather), so a hop
moves at t links' bandwidth. Ranks are placed tensor-parallel innermost (t consecutive
devices of a node), then one of two ways over a node's n / t remaining slots, whichever gives
the shorter step:

    data-parallel within nodes   the D replicas of a stage share a node when D divides n / t
                                 (all-reduce over NVLink); pipeline hops cross nodes
    pipelines within nodes       a whole pipeline shares a node when S divides n / t (hops
                                 over NVLink); the all-reduce crosses nodes
    pipeline across nodes        the same order when S does not fit a node: hops on the network

(one node: every link is NVLink). Memory per device: ``bytes_per_param`` per parameter (16
for Adam in mixed precision or fp32, see ``costs.analytic``), or with ``shard_optimizer`` (ZeRO
stage 1, Rajbhandari et al. 2020) the weights and gradients whole and the rest split D ways.
The search is exact and pruned: (t, S, D) are opened in the order of a lower bound on their
step (:func:`_bound`); one whose bound is not below the runner-up so far is skipped. The
result is the best layout and the runner-up with another (t, S); pure: no torch, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from autopipe.costs.devices import DeviceSpec
from autopipe.costs.profile import Profile
from autopipe.costs.tensor import TransformerShape, tensor_degrees, tensor_reason
from autopipe.errors import InfeasibleError, PlanError
from autopipe.plans import MAX_MICRO_BATCHES, MAX_REPLICAS, Plan
from autopipe.solve.request import divisors
from autopipe.solve.search import PlanRequest, Progress, plan_pipeline
from autopipe.units import format_bytes

__all__ = [
    "Cluster", "Layout", "ParallelOption", "ParallelPlan", "ParallelRequest", "Rejected", "TensorOptions", "layouts", "model_flops", "plan_parallel", "ring_allreduce_s",
]  # fmt: skip


@dataclass(frozen=True)
class Cluster:
    """G devices, ``devices_per_node`` to a node joined by NVLink, nodes by the network
    (bandwidths per device, one direction)."""

    devices: int
    devices_per_node: int
    nvlink_bandwidth: float  # bytes/s per device, one direction
    network_bandwidth: float  # bytes/s per device across nodes
    link_latency_s: float = 10e-6  # within a node
    network_latency_s: float | None = None  # across nodes; None: link_latency_s

    @staticmethod
    def of(spec: DeviceSpec, devices: int) -> Cluster:
        return Cluster(devices, spec.devices_per_node, spec.nvlink_bandwidth, spec.network_bandwidth, spec.link_latency_s)

    @property
    def net_latency_s(self) -> float:
        return self.link_latency_s if self.network_latency_s is None else self.network_latency_s


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
    stages: int | None = None  # pin S
    micro_batches: int | None = None
    schedule: str | None = None
    virtual: int | None = None
    recompute: str = "auto"
    alternatives: int = 5
    action_overhead_s: float = 0.0  # the executor's cost per action (PlanRequest's)
    tensor_parallel: int | None = None  # pin t
    data_parallel: int | None = None  # pin D


@dataclass(frozen=True)
class Layout:
    stages: int  # S
    data_parallel: int  # D
    placement: str  # "one node", "data-parallel within nodes", "pipelines within nodes", "pipeline across nodes"
    p2p_bandwidth: float  # between neighbouring pipeline stages (a whole t-wide group's)
    allreduce_bandwidth: float  # within one stage's data-parallel group, per device
    tensor_parallel: int = 1  # t
    p2p_latency_s: float = 10e-6
    allreduce_latency_s: float = 10e-6


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
            f"t={lay.tensor_parallel} x S={lay.stages} x D={lay.data_parallel} ({lay.placement}): {p.schedule}, m={p.micro_batches}, "
            f"step {_seconds(p.step_time_s)} (pipeline {_seconds(p.iteration_time_s)} + all-reduce {_seconds(p.allreduce_s)})"
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


def ring_allreduce_s(nbytes: float, group: int, bandwidth: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce of ``nbytes`` among ``group`` devices: 2(D-1)/D * bytes / bandwidth."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (group - 1) / group * nbytes / bandwidth + 2.0 * (group - 1) * latency_s


def layouts(stages: int, data_parallel: int, cluster: Cluster, tensor_parallel: int = 1) -> list[Layout]:
    """The distinct ways to place t x S x D ranks on the cluster's nodes (see the module docstring)."""
    t = tensor_parallel
    n, nv, net = cluster.devices_per_node // t, cluster.nvlink_bandwidth, cluster.network_bandwidth
    lat, nlat = cluster.link_latency_s, cluster.net_latency_s
    S, D = stages, data_parallel
    if S * D <= n:
        return [Layout(S, D, "one node", nv * t, nv, t, lat, lat)]
    inner = n % S == 0
    out = [
        Layout(S, D, "data-parallel within nodes", net * t, nv if n % D == 0 else net, t, nlat, lat if n % D == 0 else nlat),
        Layout(S, D, "pipelines within nodes" if inner else "pipeline across nodes", (nv if inner else net) * t, net, t,
               lat if inner else nlat, nlat),
    ]  # fmt: skip
    if S == 1 or D == 1:  # no hops, or no all-reduce: one of the two is moot
        out = [out[0] if S == 1 else out[1]]
    unique: dict[tuple[float, float], Layout] = {}
    for lay in out:
        unique.setdefault((lay.p2p_bandwidth if S > 1 else 0.0, lay.allreduce_bandwidth if D > 1 else 0.0), lay)
    return list(unique.values())


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
                rejected.append(Rejected(S, 0, f"{S} stages do not divide {G // t} = {G} devices / t={t}", tensor_parallel=t))
                continue
            D = G // (t * S)
            why = _cannot(prof, request, t, S, D)
            if why is not None:
                rejected.append(Rejected(S, D, why, tensor_parallel=t))
                continue
            candidates.append((_bound(prof, request, t, S, D), t, S, D, prof))
    candidates.sort(key=lambda c: c[:4])
    options: list[ParallelOption] = []
    pruned = 0
    for bound, t, S, D, prof in candidates:
        if _beaten(bound, options):
            pruned += 1
            continue
        options.extend(_options(prof, request, t, S, D, progress, rejected, tensor is not None and tensor.sequence_parallel))
    if not options:
        raise _no_layout(request, rejected)
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
            fix = "plan it analytically (--device NAME) or drop --tensor-parallel" if shape is None else "pick a degree that divides them"
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
        return f"needs at least {format_bytes(static, round_up=True)} per device for weights, gradients and optimizer state"
    return None


def _bound(profile: Profile, request: ParallelRequest, t: int, S: int, D: int) -> float:
    """A lower bound on the step of any plan of (t, S, D), whatever its schedule and cuts: for
    the best micro-batch count m (size u = U / m of the replica's share U), the larger of the
    busiest device's work, at least the average m (F + B)(u) / S, and micro-batch 0's chain
    forward through every block and back (input gradients); plus the average stage's gradient
    all-reduce on the fastest link the layouts offer. Recomputation and hops only add."""
    U = request.global_batch // D
    counts = [request.micro_batches] if request.micro_batches else [m for m in divisors(U) if m <= MAX_MICRO_BATCHES]
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


def _beaten(bound: float, options: list[ParallelOption]) -> bool:
    """True when a plan of another (t, S) than the best's is at least as fast as ``bound``, so
    the best and the runner-up are both found (tolerating rounding)."""
    ranked = sorted(options, key=_order)
    second = next((o for o in ranked if _key(o) != _key(ranked[0])), None)
    return second is not None and bound * (1 - 1e-9) >= second.step_time_s


def _options(
    profile: Profile, request: ParallelRequest, t: int, S: int, D: int, progress: Progress | None, rejected: list[Rejected],
    sp: bool,
) -> list[ParallelOption]:  # fmt: skip
    out: list[ParallelOption] = []
    plans: dict[tuple[float, float], Plan] = {}
    for lay in layouts(S, D, request.cluster, t):
        link = (lay.p2p_bandwidth, lay.p2p_latency_s)
        try:
            if link not in plans:
                told = None if progress is None else _labelled(progress, f"t={t} x S={S} x D={D}: ")
                plans[link] = plan_pipeline(profile, _pipeline_request(profile, request, lay), told)
        except (InfeasibleError, PlanError) as e:
            need = e.min_memory_bytes if isinstance(e, InfeasibleError) else None
            rejected.append(Rejected(S, D, str(e), need, t))
            break
        out.append(ParallelOption(lay, _with_allreduce(profile, plans[link], lay, request, sp)))
    return out


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
        micro_batches=request.micro_batches,
        schedule=request.schedule,
        virtual=request.virtual,
        recompute=request.recompute,
        link_bandwidth=lay.p2p_bandwidth,
        link_latency_s=lay.p2p_latency_s,
        state_factor=_state_factor(profile, request, lay.data_parallel),
        alternatives=request.alternatives,
        action_overhead_s=request.action_overhead_s,
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
    return model, model + again


def _no_layout(request: ParallelRequest, rejected: list[Rejected]) -> PlanError:
    deepest = max(rejected, key=lambda r: r.stages, default=None)
    hint = f"; the deepest pipeline (S={deepest.stages}): {deepest.reason}" if deepest else ""
    return InfeasibleError(
        f"no split of {request.cluster.devices} devices into tensor x pipeline x data parallel fits {format_bytes(request.memory_limit)} per device"
        f"{hint}"
    )
