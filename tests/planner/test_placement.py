"""Placing t x S x D ranks on nodes: the links each placement uses, the ring all-reduce's price."""

from __future__ import annotations

import pytest

from autopipe.planner.placement import Cluster, layouts, ring_allreduce_s

GB = 1e9
CLUSTER = Cluster(
    devices=8, devices_per_node=4, nvlink_bandwidth=100 * GB, network_bandwidth=10 * GB, link_latency_s=0.0
)


@pytest.mark.parametrize(
    ("nbytes", "group", "bandwidth", "latency", "expected"),
    [
        (1e9, 1, 1e9, 0.0, 0.0),  # nothing to reduce
        (1e9, 2, 1e9, 0.0, 1.0),  # 2 (D-1)/D = 1
        (1e9, 4, 1e9, 0.0, 1.5),
        (1e9, 8, 1e10, 1e-3, 2 * 7 / 8 * 0.1 + 14e-3),
    ],
)
def test_ring_allreduce_time(nbytes: float, group: int, bandwidth: float, latency: float, expected: float) -> None:
    assert ring_allreduce_s(nbytes, group, bandwidth, latency) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("S", "D", "expected"),
    [
        (2, 2, [("one node", 100, 100)]),  # 4 devices fit one node: NVLink everywhere
        (2, 4, [("data-parallel within nodes", 10, 100), ("pipelines within nodes", 100, 10)]),
        (8, 1, [("pipeline across nodes", 10, 10)]),  # 8 stages span 2 nodes, nothing to reduce
        (1, 8, [("data-parallel across nodes", 10, 10)]),  # 8 replicas span 2 nodes
        (8, 3, [("pipeline and data-parallel across nodes", 10, 10)]),  # neither divides a node of 4
    ],
)
def test_layouts_price_the_links_each_placement_uses(S: int, D: int, expected: list[tuple[str, float, float]]) -> None:
    got = [(lay.placement, lay.p2p_bandwidth / GB, lay.allreduce_bandwidth / GB) for lay in layouts(S, D, CLUSTER)]
    assert got == expected
