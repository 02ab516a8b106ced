"""Where the ranks of t x S x D go on a cluster's nodes, and what their links cost.

Ranks are placed tensor-parallel innermost (t consecutive devices of a node), then one of two
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
"""

from __future__ import annotations

from dataclasses import dataclass

from autopipe.costs.devices import DeviceSpec

__all__ = ["Cluster", "Layout", "layouts", "ring_allreduce_s"]


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
        ),
    ]
    if S == 1 or D == 1:  # no hops, or no all-reduce: one of the two is moot
        out = [out[0] if S == 1 else out[1]]
    unique: dict[tuple[float, float], Layout] = {}
    for lay in out:
        unique.setdefault((lay.p2p_bandwidth if S > 1 else 0.0, lay.allreduce_bandwidth if D > 1 else 0.0), lay)
    return list(unique.values())
