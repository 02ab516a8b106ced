"""Where the ranks of t x S x D go on a cluster's nodes, and what their links cost.

Ranks are placed tensor-parallel innermost (t consecutive devices of a node; with context
parallelism, Megatron-Core's order, the t cp ranks of a (tensor, context) group, which take the
place of t below, and cross nodes together when wider than one), then one of two
ways over a node's n / t remaining slots (``layouts``; the search keeps whichever gives the
shorter step):

    data-parallel within nodes   the D replicas of a stage share a node when D divides n / t
                                 (all-reduce over NVLink); pipeline hops cross nodes
    pipelines within nodes       a whole pipeline shares a node when S divides n / t (hops
                                 over NVLink); the all-reduce crosses nodes
    ... across nodes             when neither fits a node's n / t slots (a node holds one
                                 tensor-parallel group, say): hops and all-reduce on the network

(one node: every link is NVLink). Between stages each of the t devices sends its 1/t of the
activation, so a hop moves at t links' bandwidth; a stage's gradients are ring all-reduced
among its D replicas (Patarasuk & Yuan 2009), each device of a group its own 1/t shard.

**Sharding** (Rajbhandari et al. 2020, "ZeRO"; ``modes.Sharding``) splits a stage's training
state over ``N`` of its D replicas: N = D, or, *hybrid* (HSDP), N = the stage's replicas on one
node (``Layout.node_replicas``), the shards then replicated D / N times across nodes. Per
parameter, of ``b = 2 + 2 + K`` bytes (bf16 weights and gradients, K of fp32 master weights and
Adam state; ``e`` bytes per stored element in general), a device holds (:func:`state_bytes`)::

    none         b                    zero2   e + (b - e) / N
    zero1        2e + (b - 2e) / N    zero3   b / N
    zero3-step   as zero1 (the weights are gathered once a step and kept, their gradients whole)

with the gradients ``g`` bytes wide in place of ``e`` where the framework keeps them wider than
the weights (``grad_ratio`` = g / e; below): Megatron-LM's bf16 weights with fp32 gradients hold
``2 + 4 + 12 / N`` bytes under its distributed optimizer and 18 without
(``docs/user-guide/features/dist_optimizer.md``: "bf16 parameters, fp32 gradients | 18 | 6 + 12/d",
its main-gradient buffer being fp32), not ``4 + 12 / N`` and 16;

plus, while a block runs, its gathered weights and gradients (:func:`transient_bytes`: zero2
one block's gradients before their reduce-scatter; zero3 the block's weights, the next block's
prefetched and the block's gradients, three of the largest block). The communication, in
ring collectives of a chunk's P bytes (a reduce-scatter or an all-gather moves (N - 1) / N P
per device, an all-reduce twice that; :func:`step_comm`, :func:`micro_comm`):

    none         per step: all-reduce of P over the D replicas
    zero1        per step: reduce-scatter of P and all-gather of P over N (Megatron's distributed
                 optimizer: an all-reduce's volume), plus, hybrid, an all-reduce of P / N over D / N
    zero3-step   as zero1 (FSDP without resharding, as torch's pipeline stages run it)
    zero2        per micro-batch: reduce-scatter of each block's gradients; per step: all-gather
                 of P (and the hybrid all-reduce)
    zero3        per micro-batch: all-gather of each block's weights in the forward and again in
                 the backward, reduce-scatter of its gradients; per step: the hybrid all-reduce

Within a shard group of one node the collectives take NVLink, across nodes the network.

**Gradients in fp32.** Where the framework reduces the gradients of bf16 weights in fp32
(Megatron-LM: ``arguments.py`` sets ``accumulate_allreduce_grads_in_fp32`` for ``--bf16`` unless
``--grad-reduce-in-bf16``, and its DDP reduces the fp32 ``main_grad`` buffer; torchtitan's FSDP2
``mixed_precision_reduce = "float32"``), every collective that reduces gradients moves
``DataGroup.reduce_ratio`` = 4 / 2 = 2 bytes per parameter byte, and the gradients it accumulates
into are fp32 too (``state_bytes``' ``grad_ratio``); the weights' all-gathers stay in
the weights' dtype::

    zero1, bf16 weights reduced in fp32:  reduce-scatter (N-1)/N 2P, all-gather (N-1)/N P
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autopipe.costs.devices import DeviceSpec
from autopipe.modes import Sharding

__all__ = [
    "Cluster",
    "DataGroup",
    "Layout",
    "data_group",
    "layouts",
    "micro_comm",
    "reduce_ratio",
    "reduce_scatter_s",
    "ring_allreduce_s",
    "state_bytes",
    "step_comm",
    "transient_bytes",
]


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
        return Cluster(
            devices, spec.devices_per_node, spec.nvlink_bandwidth, spec.network_bandwidth, spec.link_latency_s
        )

    @property
    def net_latency_s(self) -> float:
        return self.link_latency_s if self.network_latency_s is None else self.network_latency_s


@dataclass(frozen=True)
class Layout:
    stages: int  # S
    data_parallel: int  # D
    placement: str  # "one node", "data-parallel within nodes", "pipelines within nodes", or what crosses nodes
    p2p_bandwidth: float  # between neighbouring pipeline stages (a whole t-wide group's)
    allreduce_bandwidth: float  # within one stage's data-parallel group, per device
    tensor_parallel: int = 1  # t
    p2p_latency_s: float = 10e-6
    allreduce_latency_s: float = 10e-6
    node_replicas: int = 1  # a stage's replicas on one node, consecutive in its data-parallel group
    context_parallel: int = 1  # cp: ranks splitting each sample's sequence, beside the t ones
    expert_parallel: int = 1  # ep: ranks sharing each MoE layer's routed experts
    expert_tensor_parallel: int = 1  # etp: ranks splitting each routed expert


def ring_allreduce_s(nbytes: float, group: int, bandwidth: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce of ``nbytes`` among ``group`` devices: 2(D-1)/D * bytes / bandwidth."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (group - 1) / group * nbytes / bandwidth + 2.0 * (group - 1) * latency_s


def reduce_ratio(element_bytes: float, fp32: bool) -> float:
    """Bytes a gradient reduction moves per parameter byte: 4 / ``element_bytes`` where the
    framework reduces in fp32 (``fp32``) weights stored narrower, else 1 (module docstring)."""
    return max(1.0, 4.0 / element_bytes) if fp32 and element_bytes > 0 else 1.0


def reduce_scatter_s(nbytes: float, group: int, bandwidth: float, latency_s: float = 0.0) -> float:
    """Ring reduce-scatter (or all-gather) of ``nbytes`` among ``group`` devices: (N-1)/N * bytes / bandwidth."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    return (group - 1) / group * nbytes / bandwidth + (group - 1) * latency_s


@dataclass(frozen=True)
class DataGroup:
    """A stage's ``replicas`` as a sharding sees them: shards of ``shard`` replicas (all of them,
    or hybrid: fewer, within a node), each shard's ``replicas / shard`` copies across nodes."""

    replicas: int  # D
    shard: int  # N
    inner_bandwidth: float  # within a shard group, per device
    inner_latency_s: float
    outer_bandwidth: float  # between the copies of a shard (hybrid only)
    outer_latency_s: float
    reduce_ratio: float = 1.0  # bytes a gradient reduction moves per parameter byte (2: bf16 weights, fp32 grads)

    @property
    def copies(self) -> int:
        return self.replicas // self.shard


def data_group(lay: Layout, cluster: Cluster, shard: int | None = None, reduce_ratio: float = 1.0) -> DataGroup | None:
    """The data-parallel group of ``lay`` sharded ``shard`` ways (None: over all D replicas); None
    when ``shard`` does not divide D. A shard group within a node (``shard`` divides the stage's
    replicas on one node) talks over NVLink, else over the network; so do the copies. Its
    gradient reductions move ``reduce_ratio`` bytes per parameter byte (module docstring)."""
    D = lay.data_parallel
    n = D if shard is None else shard
    if n < 1 or D % n:
        return None
    if n == D:
        bw, lat = lay.allreduce_bandwidth, lay.allreduce_latency_s
        return DataGroup(D, D, bw, lat, bw, 0.0, reduce_ratio)
    nv, net = (cluster.nvlink_bandwidth, cluster.link_latency_s), (cluster.network_bandwidth, cluster.net_latency_s)
    inner = nv if lay.node_replicas % n == 0 else net
    outer = nv if lay.node_replicas % D == 0 else net
    return DataGroup(D, n, inner[0], inner[1], outer[0], outer[1], reduce_ratio)


def state_bytes(
    kind: Sharding, shard: int, bytes_per_param: float, element_bytes: float, grad_ratio: float = 1.0
) -> float:
    """Bytes a device holds per parameter under ``kind`` over ``shard`` replicas (module docstring);
    ``grad_ratio``: the gradients' bytes per weight byte (2: bf16 weights, fp32 gradients)."""
    e, g, n = element_bytes, element_bytes * grad_ratio, max(shard, 1)
    b = bytes_per_param + g - e  # bytes_per_param counts the gradients at the weights' width
    if kind == Sharding.NONE:
        return b
    if kind in (Sharding.ZERO1, Sharding.ZERO3_STEP):
        return e + g + (b - e - g) / n
    if kind == Sharding.ZERO2:
        return e + (b - e) / n
    return b / n


def transient_bytes(kind: Sharding, largest_block_bytes: float) -> float:
    """Bytes gathered or not yet reduced while a block runs (module docstring), beside the state."""
    return {Sharding.ZERO2: 1.0, Sharding.ZERO3: 3.0}.get(kind, 0.0) * largest_block_bytes


def step_comm(kind: Sharding, group: DataGroup, nbytes: float) -> tuple[float, float]:
    """(reduce, gather) seconds per step of a chunk of ``nbytes`` of parameters on one device: its
    gradients reduced after (or under) its last backward, its weights gathered before (or under)
    its first forward (the gradients' collectives on ``group.reduce_ratio`` times the bytes)."""
    g, bw, lat = group.shard, group.inner_bandwidth, group.inner_latency_s
    grads = nbytes * group.reduce_ratio
    if kind == Sharding.NONE:
        return ring_allreduce_s(grads, group.replicas, bw, lat), 0.0
    hybrid = ring_allreduce_s(grads / g, group.copies, group.outer_bandwidth, group.outer_latency_s)
    gather = reduce_scatter_s(nbytes, g, bw, lat)
    if kind in (Sharding.ZERO1, Sharding.ZERO3_STEP):
        return reduce_scatter_s(grads, g, bw, lat) + hybrid, gather
    return hybrid, gather if kind == Sharding.ZERO2 else 0.0


def micro_comm(kind: Sharding, group: DataGroup, nbytes: float) -> tuple[float, float]:
    """(gather, reduce) seconds per micro-batch of a block of ``nbytes`` of parameters on one device:
    zero3 gathers its weights once in the forward and once in the backward, zero2 and zero3
    reduce-scatter its gradients in the backward; the others nothing."""
    g, bw, lat = group.shard, group.inner_bandwidth, group.inner_latency_s
    gather = reduce_scatter_s(nbytes, g, bw, lat) if kind == Sharding.ZERO3 else 0.0
    grads = nbytes * group.reduce_ratio
    reduce = reduce_scatter_s(grads, g, bw, lat) if kind in (Sharding.ZERO2, Sharding.ZERO3) else 0.0
    return gather, reduce


def layouts(
    stages: int, data_parallel: int, cluster: Cluster, tensor_parallel: int = 1, context_parallel: int = 1
) -> list[Layout]:
    """The distinct ways to place t x cp x S x D ranks on the cluster's nodes (see the module
    docstring): the t cp ranks of a (tensor, context) group are consecutive, a hop moving at t cp
    links' bandwidth; a group wider than a node puts every hop and all-reduce on the network."""
    width = tensor_parallel * context_parallel
    if width > cluster.devices_per_node:
        net, nlat = cluster.network_bandwidth, cluster.net_latency_s
        S, D = stages, data_parallel
        where = "context-parallel across nodes"
        one = Layout(S, D, where, net * width, net, tensor_parallel, nlat, nlat, 1, context_parallel)
        return [one]
    if context_parallel == 1:
        return _layouts(stages, data_parallel, cluster, tensor_parallel)
    return [
        replace(lay, tensor_parallel=tensor_parallel, context_parallel=context_parallel)
        for lay in _layouts(stages, data_parallel, cluster, width)
    ]


def _layouts(stages: int, data_parallel: int, cluster: Cluster, tensor_parallel: int) -> list[Layout]:
    t = tensor_parallel
    n, nv, net = cluster.devices_per_node // t, cluster.nvlink_bandwidth, cluster.network_bandwidth
    lat, nlat = cluster.link_latency_s, cluster.net_latency_s
    S, D = stages, data_parallel
    if S * D <= n:
        return [Layout(S, D, "one node", nv * t, nv, t, lat, lat, D)]
    per_pipeline_node = n // S if n % S == 0 else 1  # replicas of a stage on a node that holds whole pipelines
    inner, replicas_inner = n % S == 0, n % D == 0
    across = (
        "pipeline and data-parallel across nodes"
        if S > 1 and D > 1
        else "pipeline across nodes"
        if S > 1
        else "data-parallel across nodes"
    )
    out = [
        Layout(
            S,
            D,
            "data-parallel within nodes" if replicas_inner else across,
            net * t,
            nv if replicas_inner else net,
            t,
            nlat,
            lat if replicas_inner else nlat,
            D if replicas_inner else n if D % n == 0 else 1,
        ),
        Layout(
            S,
            D,
            "pipelines within nodes" if inner else across,
            (nv if inner else net) * t,
            net,
            t,
            lat if inner else nlat,
            nlat,
            per_pipeline_node if D % per_pipeline_node == 0 else 1,
        ),
    ]
    if S == 1 or D == 1:  # no hops, or no all-reduce: one of the two is moot
        out = [out[0] if S == 1 else out[1]]
    unique: dict[tuple[float, float, int], Layout] = {}
    for lay in out:
        key = (lay.p2p_bandwidth if S > 1 else 0.0, lay.allreduce_bandwidth if D > 1 else 0.0, lay.node_replicas)
        unique.setdefault(key, lay)
    return list(unique.values())
