"""Data x pipeline parallel: split G devices into D replicas of an S-stage pipeline.

For every pipeline depth S that divides G (at most one block per stage), with data-parallel
width D = G / S, each replica trains ``global_batch / D`` samples per iteration; the pipeline
planner (:func:`~autopipe.solve.search.plan_pipeline`) chooses cuts, micro-batches, schedule,
virtual stages and recomputation for that share, and the step ends with each stage's ring
all-reduce of its gradients among its D replicas (Patarasuk & Yuan 2009; the data-parallel
half of Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM")::

    allreduce_s = 2 (D - 1) / D * gradient_bytes / bandwidth + 2 (D - 1) * latency
    step_s      = simulated pipeline iteration + max over ranks of allreduce_s

counted after the pipeline flush (no overlap with the backward pass: an upper bound). Ranks
are laid out one of two ways, whichever gives the shorter step:

    data-parallel within nodes   the D replicas of a stage share a node when D divides the
                                 node (all-reduce over NVLink); pipeline hops cross nodes
    pipelines within nodes       a whole pipeline shares a node when S divides the node
                                 (hops over NVLink); the all-reduce crosses nodes

(one node: every link is NVLink). Memory per device: ``bytes_per_param`` per parameter (16
for Adam in mixed precision or fp32, see ``costs.analytic``), or with ``shard_optimizer`` (ZeRO
stage 1, Rajbhandari et al. 2020) the weights and gradients whole and the rest split D ways.
The result is the best layout and the runner-up with another (S, D); pure: no torch, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autopipe.costs.devices import DeviceSpec
from autopipe.costs.profile import Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.plans import MAX_REPLICAS, Plan
from autopipe.solve.request import divisors
from autopipe.solve.search import PlanRequest, Progress, plan_pipeline
from autopipe.units import format_bytes

__all__ = [
    "Cluster",
    "Layout",
    "ParallelOption",
    "ParallelPlan",
    "ParallelRequest",
    "Rejected",
    "layouts",
    "plan_parallel",
    "ring_allreduce_s",
]


@dataclass(frozen=True)
class Cluster:
    """G devices, ``devices_per_node`` to a node joined by NVLink, nodes by the network."""

    devices: int
    devices_per_node: int
    nvlink_bandwidth: float  # bytes/s per device, one direction
    network_bandwidth: float  # bytes/s per device across nodes
    link_latency_s: float = 10e-6

    @staticmethod
    def of(spec: DeviceSpec, devices: int) -> Cluster:
        return Cluster(devices, spec.devices_per_node, spec.nvlink_bandwidth, spec.network_bandwidth, spec.link_latency_s)


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


@dataclass(frozen=True)
class Layout:
    stages: int  # S
    data_parallel: int  # D
    placement: str  # "one node", "data-parallel within nodes", "pipelines within nodes"
    p2p_bandwidth: float  # between neighbouring pipeline stages
    allreduce_bandwidth: float  # within one stage's data-parallel group


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
            f"S={lay.stages} x D={lay.data_parallel} ({lay.placement}): {p.schedule}, m={p.micro_batches}, "
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


@dataclass(frozen=True)
class ParallelPlan:
    best: ParallelOption
    runner_up: ParallelOption | None  # the best with another (S, D)
    rejected: tuple[Rejected, ...]  # the (S, D) with no plan, and why

    @property
    def plan(self) -> Plan:
        return self.best.plan


def ring_allreduce_s(nbytes: float, group: int, bandwidth: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce of ``nbytes`` among ``group`` devices: 2(D-1)/D * bytes / bandwidth."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (group - 1) / group * nbytes / bandwidth + 2.0 * (group - 1) * latency_s


def layouts(stages: int, data_parallel: int, cluster: Cluster) -> list[Layout]:
    """The distinct ways to place S x D ranks on the cluster's nodes (see the module docstring)."""
    n, nv, net = cluster.devices_per_node, cluster.nvlink_bandwidth, cluster.network_bandwidth
    S, D = stages, data_parallel
    if S * D <= n:
        return [Layout(S, D, "one node", nv, nv)]
    out = [
        Layout(S, D, "data-parallel within nodes", net, nv if n % D == 0 else net),
        Layout(S, D, "pipelines within nodes", nv if n % S == 0 else net, net),
    ]
    if S == 1 or D == 1:  # no hops, or no all-reduce: one of the two is moot
        out = [out[0] if S == 1 else out[1]]
    unique: dict[tuple[float, float], Layout] = {}
    for lay in out:
        unique.setdefault((lay.p2p_bandwidth if S > 1 else 0.0, lay.allreduce_bandwidth if D > 1 else 0.0), lay)
    return list(unique.values())


def plan_parallel(profile: Profile, request: ParallelRequest, progress: Progress | None = None) -> ParallelPlan:
    """The (S, D) layout and pipeline plan with the shortest step that fits memory;
    ``progress(what, done, total)`` is told each search (``plan_pipeline``'s), per layout."""
    G, B = request.cluster.devices, request.global_batch
    if G < 1 or B < 1:
        raise PlanError(f"need at least one device and one sample (got {G} devices, batch {B})")
    if request.stages is not None and (request.stages < 1 or G % request.stages):
        raise PlanError(f"--stages {request.stages} does not divide {G} devices; use a divisor of {G}")
    depths = [request.stages] if request.stages else divisors(G)  # at most 2**16 stages: no endless loop on a huge G
    options: list[ParallelOption] = []
    rejected: list[Rejected] = []
    for S in depths:
        D = G // S
        if S > profile.num_blocks:
            rejected.append(Rejected(S, D, f"{S} stages but the model has {profile.num_blocks} blocks"))
            continue
        if B % D:
            rejected.append(Rejected(S, D, f"global batch {B} does not split into {D} equal replicas"))
            continue
        if D > MAX_REPLICAS:
            rejected.append(Rejected(S, D, f"{D} replicas, more than autopipe plans (at most {MAX_REPLICAS} = 2**20)"))
            continue
        static = _static_bound(profile, request, S, D)
        if static > request.memory_limit:
            rejected.append(Rejected(S, D, f"needs at least {format_bytes(static, round_up=True)} per device for weights, gradients and optimizer state"))
            continue
        plans: dict[float, Plan] = {}
        for lay in layouts(S, D, request.cluster):
            try:
                if lay.p2p_bandwidth not in plans:
                    told = None if progress is None else _labelled(progress, f"S={S} x D={D}: ")
                    plans[lay.p2p_bandwidth] = plan_pipeline(profile, _pipeline_request(profile, request, lay), told)
            except (InfeasibleError, PlanError) as e:
                need = e.min_memory_bytes if isinstance(e, InfeasibleError) else None
                rejected.append(Rejected(S, D, str(e), need))
                break
            options.append(ParallelOption(lay, _with_allreduce(profile, plans[lay.p2p_bandwidth], lay, request)))
    if not options:
        raise _no_layout(request, rejected)
    options.sort(key=lambda o: (o.step_time_s, o.layout.stages, o.layout.placement))
    best = options[0]
    runner_up = next((o for o in options if o.layout.stages != best.layout.stages), None)
    note = f"chose {best.describe()}; runner-up: {runner_up.describe() if runner_up else 'none fits'}"
    best = replace(best, plan=replace(best.plan, parallel_note=note))
    return ParallelPlan(best, runner_up, tuple(rejected))


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
        link_latency_s=request.cluster.link_latency_s,
        state_factor=_state_factor(profile, request, lay.data_parallel),
        alternatives=request.alternatives,
        action_overhead_s=request.action_overhead_s,
    )


def _with_allreduce(profile: Profile, plan: Plan, lay: Layout, request: ParallelRequest) -> Plan:
    params = sum(b.params for b in profile.blocks)
    elt = sum(b.param_bytes for b in profile.blocks) / params if params else 4.0
    per_rank = [0.0] * lay.stages
    for s in plan.stages:
        per_rank[s.rank] += s.params * elt  # gradients in the parameters' dtype
    allreduce = max(
        ring_allreduce_s(g, lay.data_parallel, lay.allreduce_bandwidth, request.cluster.link_latency_s) for g in per_rank
    )
    step = plan.iteration_time_s + allreduce
    return replace(
        plan,
        data_parallel=lay.data_parallel,
        allreduce_s=allreduce,
        throughput=request.global_batch / step if step > 0 else math.inf,
        link_bandwidth=lay.p2p_bandwidth,
    )


def _no_layout(request: ParallelRequest, rejected: list[Rejected]) -> PlanError:
    deepest = max(rejected, key=lambda r: r.stages, default=None)
    hint = f"; the deepest pipeline (S={deepest.stages}): {deepest.reason}" if deepest else ""
    return InfeasibleError(
        f"no split of {request.cluster.devices} devices into stages x replicas fits {format_bytes(request.memory_limit)} per device"
        f"{hint}"
    )
