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


# --------------------------------------------------------------------------- sharding


from autopipe.modes import Sharding  # noqa: E402
from autopipe.planner.placement import (  # noqa: E402
    Layout,
    data_group,
    micro_comm,
    reduce_ratio,
    reduce_scatter_s,
    state_bytes,
    step_comm,
    transient_bytes,
)


@pytest.mark.parametrize(
    ("kind", "gigabytes"),
    [  # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, K = 12, N_d = 64 data-parallel devices
        (Sharding.NONE, 120.0),
        (Sharding.ZERO1, 31.4),
        (Sharding.ZERO2, 16.6),
        (Sharding.ZERO3, 1.9),
        (Sharding.ZERO3_STEP, 31.4),  # gathered once a step and kept: ZeRO-1's memory
    ],
)
def test_state_per_device_is_the_zero_papers(kind: Sharding, gigabytes: float) -> None:
    psi = 7.5e9
    assert state_bytes(kind, 64, bytes_per_param=16.0, element_bytes=2.0) * psi / 1e9 == pytest.approx(
        gigabytes, abs=0.05
    )


def test_state_formulas_by_hand() -> None:
    # fp32 weights (e = 4), plain Adam (b = 16 = 4 + 4 + 8), over 4 replicas
    assert state_bytes(Sharding.ZERO1, 4, 16.0, 4.0) == 4 + 4 + 8 / 4
    assert state_bytes(Sharding.ZERO2, 4, 16.0, 4.0) == 4 + 12 / 4
    assert state_bytes(Sharding.ZERO3, 4, 16.0, 4.0) == 16 / 4
    assert state_bytes(Sharding.NONE, 4, 16.0, 4.0) == 16
    assert transient_bytes(Sharding.ZERO3, 10.0) == 30.0 and transient_bytes(Sharding.ZERO2, 10.0) == 10.0
    assert transient_bytes(Sharding.ZERO1, 10.0) == 0.0


@pytest.mark.parametrize("d", [1, 8, 64])
def test_bf16_weights_with_fp32_gradients_are_megatrons_bytes(d: int) -> None:
    """Megatron-LM's docs/user-guide/features/dist_optimizer.md: "bf16 parameters, fp32 gradients":
    18 bytes a parameter without the distributed optimizer, 6 + 12/d with it (its main-gradient
    buffer fp32: arguments.py sets accumulate_allreduce_grads_in_fp32 for --bf16)."""
    assert state_bytes(Sharding.NONE, d, 16.0, 2.0, grad_ratio=2.0) == 18
    assert state_bytes(Sharding.ZERO1, d, 16.0, 2.0, grad_ratio=2.0) == pytest.approx(6 + 12 / d)
    # FSDP gathering once a step, fp32 gradients accumulated whole (Llama 3): the same
    assert state_bytes(Sharding.ZERO3_STEP, d, 16.0, 2.0, grad_ratio=2.0) == pytest.approx(6 + 12 / d)
    assert state_bytes(Sharding.ZERO2, d, 16.0, 2.0, grad_ratio=2.0) == pytest.approx(2 + 16 / d)
    assert state_bytes(Sharding.ZERO3, d, 16.0, 2.0, grad_ratio=2.0) == pytest.approx(18 / d)
    # gradients reduced in bf16 (--grad-reduce-in-bf16): 4 + 12/d, as before
    assert state_bytes(Sharding.ZERO1, d, 16.0, 2.0) == pytest.approx(4 + 12 / d)


def _lay(D: int, node_replicas: int, allreduce_bandwidth: float = 10 * GB) -> Layout:
    return Layout(1, D, "x", 0.0, allreduce_bandwidth, 1, 0.0, 0.0, node_replicas)


def test_collectives_per_step_are_the_zero_papers_volumes() -> None:
    """Baseline data parallelism and ZeRO-1 move 2 psi per device and step, ZeRO-3 3 psi per
    micro-batch (Rajbhandari et al. 2020, section 7: (N-1)/N of it on a ring of N)."""
    psi, N, bw = 1e9, 4, 10 * GB
    group = data_group(_lay(N, 1, bw), CLUSTER)
    assert group is not None and group.shard == N
    one = (N - 1) / N * psi / bw  # a reduce-scatter, or an all-gather, of psi on a ring of N
    assert reduce_scatter_s(psi, N, bw) == pytest.approx(one)
    assert step_comm(Sharding.NONE, group, psi) == pytest.approx((2 * one, 0.0))
    assert sum(step_comm(Sharding.ZERO1, group, psi)) == pytest.approx(2 * one)
    assert step_comm(Sharding.ZERO1, group, psi) == pytest.approx((one, one))
    assert step_comm(Sharding.ZERO3_STEP, group, psi) == step_comm(Sharding.ZERO1, group, psi)
    assert step_comm(Sharding.ZERO2, group, psi) == pytest.approx((0.0, one))  # its reduce-scatters are per micro-batch
    assert micro_comm(Sharding.ZERO2, group, psi) == pytest.approx((0.0, one))
    assert step_comm(Sharding.ZERO3, group, psi) == (0.0, 0.0)
    gather, reduce = micro_comm(Sharding.ZERO3, group, psi)  # gathered in the forward and again in the backward
    assert 2 * gather + reduce == pytest.approx(3 * one)
    assert micro_comm(Sharding.ZERO1, group, psi) == (0.0, 0.0)


def test_hybrid_groups_shard_within_a_node_and_all_reduce_across() -> None:
    """8 replicas, 4 on a node: shards of 4 over NVLink (100 GB/s), each shard's 2 copies
    all-reducing their quarter over the network (10 GB/s)."""
    psi = 1e9
    group = data_group(_lay(8, 4), CLUSTER, 4)
    assert group is not None and (group.shard, group.copies) == (4, 2)
    assert (group.inner_bandwidth, group.outer_bandwidth) == (100 * GB, 10 * GB)
    inner = 3 / 4 * psi / (100 * GB)
    across = 2 * (1 / 2) * (psi / 4) / (10 * GB)
    assert step_comm(Sharding.ZERO1, group, psi) == pytest.approx((inner + across, inner))
    assert step_comm(Sharding.ZERO3, group, psi) == pytest.approx((across, 0.0))
    assert data_group(_lay(8, 4), CLUSTER, 3) is None  # 3 does not divide 8
    far = data_group(_lay(8, 1), CLUSTER, 4)  # a node holds one replica: its shard group crosses nodes
    assert far is not None and far.inner_bandwidth == 10 * GB


@pytest.mark.parametrize(
    ("S", "D", "expected"),
    [  # (placement, a stage's replicas on one node); nodes of 4 devices
        (2, 2, {("one node", 2)}),
        (1, 8, {("data-parallel across nodes", 4)}),  # 4 replicas a node, 2 nodes
        (2, 4, {("data-parallel within nodes", 4), ("pipelines within nodes", 2)}),
        (8, 3, {("pipeline and data-parallel across nodes", 1)}),
    ],
)
def test_layouts_say_how_many_replicas_share_a_node(S: int, D: int, expected: set[tuple[str, int]]) -> None:
    assert {(lay.placement, lay.node_replicas) for lay in layouts(S, D, CLUSTER)} == expected


def test_gradients_reduced_in_fp32_move_twice_the_bytes_of_bf16_weights() -> None:
    """Megatron-LM reduces bf16 weights' gradients in fp32 (arguments.py; DDP's fp32 main_grad
    buffer): 1 GB of bf16 weights on a ring of 4 at 10 GB/s is a 2 GB reduce-scatter, 3/4 x 2 GB /
    10 GB/s = 150 ms, beside the weights' own 75 ms all-gather; an all-reduce 300 ms; ZeRO-2's
    per-micro-batch reduce-scatter 150 ms, its gathers the weights' 75 ms."""
    psi, N, bw = 1e9, 4, 10 * GB
    assert reduce_ratio(2.0, fp32=True) == 2.0 and reduce_ratio(4.0, fp32=True) == 1.0
    assert reduce_ratio(1.0, fp32=True) == 4.0 and reduce_ratio(2.0, fp32=False) == 1.0
    group = data_group(_lay(N, 1, bw), CLUSTER, reduce_ratio=2.0)
    assert group is not None and group.reduce_ratio == 2.0
    assert step_comm(Sharding.ZERO1, group, psi) == pytest.approx((0.150, 0.075))
    assert step_comm(Sharding.NONE, group, psi) == pytest.approx((0.300, 0.0))
    assert micro_comm(Sharding.ZERO2, group, psi) == pytest.approx((0.0, 0.150))
    assert micro_comm(Sharding.ZERO3, group, psi) == pytest.approx((0.075, 0.150))
    hybrid = data_group(_lay(8, 4), CLUSTER, 4, reduce_ratio=2.0)  # 4 on NVLink, 2 copies over 10 GB/s
    assert hybrid is not None
    inner, across = 3 / 4 * 2 * psi / (100 * GB), 2 * (1 / 2) * (2 * psi / 4) / (10 * GB)
    assert step_comm(Sharding.ZERO1, hybrid, psi) == pytest.approx((inner + across, 3 / 4 * psi / (100 * GB)))
