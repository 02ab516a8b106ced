"""What a sharding makes of a pipeline search (planner/cluster/sharding.py), and a plan restamped
for a sharding that keeps more (planner/cluster/split.py's restamp)."""

from __future__ import annotations

import dataclasses

import pytest

from autopipe.costs.profile import Profile
from autopipe.modes import Sharding
from autopipe.planner.cluster import ShardOption, restamp, shard_options, sharded_profile, target_overlap
from autopipe.planner.parallel import ParallelRequest, plan_parallel
from autopipe.planner.placement import DataGroup
from autopipe.planner.request import Choices
from autopipe.plans import Overlap
from tests.planner.test_parallel import CLUSTER, _one_block


@pytest.mark.parametrize(
    ("target", "stages", "kinds"),
    [
        ("autopipe", 4, ["none", "zero1", "zero2", "zero3"]),  # zero3-step prices as zero1: not searched beside it
        ("megatron", 4, ["none", "zero1", "zero2", "zero3"]),
        ("torchtitan", 4, ["none", "zero3-step"]),  # FSDP2 with a pipeline gathers once a step
        ("torchtitan", 1, ["none", "zero3"]),
        ("torch", 2, ["none", "zero3-step"]),
    ],
)
def test_each_target_searches_the_shardings_it_runs(target: str, stages: int, kinds: list[str]) -> None:
    options, why = shard_options(target, stages, 8, None, None)
    assert not why and [o.kind for o in options if not o.node] == kinds
    assert [o.kind for o in options if o.node] == kinds[1:]  # hybrid: each sharding over a node's replicas
    assert shard_options(target, stages, 1, None, None) == ([ShardOption(Sharding.NONE)], "")


def test_overlaps_default_to_the_targets() -> None:
    assert target_overlap("autopipe") == Overlap()  # the executor posts its sends ahead, and nothing else
    assert target_overlap("megatron") == Overlap(grad_reduce=True, param_gather=True, p2p=True)
    assert target_overlap("megatron", Overlap(p2p=False)) == Overlap(p2p=False)


def test_hidden_collectives_leave_the_blocks_as_they_are() -> None:
    profile = _one_block(1.0, 10**8)  # 400 MB of weights, a 1 s forward
    group = DataGroup(2, 2, 100e9, 0.0, 100e9, 0.0)  # 2 ms to gather half of it
    overlapped = Overlap(grad_reduce=True, param_gather=True)
    assert sharded_profile(profile, Sharding.ZERO3, group, overlapped) is profile
    assert sharded_profile(profile, Sharding.ZERO1, group, Overlap()) is profile
    serial = sharded_profile(profile, Sharding.ZERO3, group, Overlap()).blocks[0]
    assert serial.forward_s(1) == pytest.approx(1.002) and serial.backward_s(1) == pytest.approx(2.004)
    slow = DataGroup(2, 2, 0.1e9, 0.0, 0.1e9, 0.0)  # 2 s to gather: outlasts the 1 s forward
    assert sharded_profile(profile, Sharding.ZERO3, slow, overlapped).blocks[0].forward_s(1) == pytest.approx(2.0)


def test_restamping_a_plan_for_more_state_keeps_its_cuts_or_says_it_does_not_fit() -> None:
    from autopipe.planner.parallel import Cluster, ParallelRequest, plan_parallel

    profile = _one_block(1.0, 10**8)
    cluster = Cluster(devices=2, devices_per_node=2, nvlink_bandwidth=100e9, network_bandwidth=10e9)
    plan = plan_parallel(profile, ParallelRequest(cluster, 2, 1e12, sharding=Sharding.ZERO1)).plan
    static = plan.stages[0].static_bytes
    more = restamp(plan, 2.0, 1e12)
    assert more is not None and more.stages[0].static_bytes == 2 * static
    assert more.peak_memory_bytes[0] == pytest.approx(plan.peak_memory_bytes[0] + static)
    assert restamp(plan, 2.0, plan.peak_memory_bytes[0] + static / 2) is None


def _bf16_block(f: float, params: int) -> Profile:
    """``_one_block`` with bf16 weights: 2 bytes a parameter."""
    block = _one_block(f, params)
    bf16 = dataclasses.replace(block.blocks[0], param_bytes=2 * params)
    return dataclasses.replace(block, blocks=(bf16,), dtype="bfloat16")


def test_megatron_prices_fp32_gradients_and_its_buckets() -> None:
    """One stage of 2e9 bf16 parameters (4 GB), 2 replicas on NVLink (100 GB/s), ZeRO-1, one
    micro-batch, F [0, 0.01], B [0.01, 0.03]. Megatron-LM reduces in fp32: the reduce-scatter moves
    1/2 x 8 GB / 100 GB/s = 40 ms, the all-gather 1/2 x 4 GB = 20 ms (60 ms in all; 40 ms reduced
    in bf16). Overlapped in its 50 buckets of 40M parameters: the reduction starts with the first
    bucket's gradients, at 0.01 + 0.02 / 50, and runs 40 ms, 20.4 ms past the backward; the
    chained gathers, 0.4 ms a bucket against 0.2 ms of forward a bucket, hold the forward
    0.4 + 49 x 0.2 = 10.2 ms."""
    profile = _bf16_block(0.01, 2 * 10**9)
    two = dataclasses.replace(CLUSTER, devices=2)
    choices = Choices(micro_batches=1, target="megatron")
    req = ParallelRequest(two, 2, 1e15, stages=1, sharding=Sharding.ZERO1, choices=choices, overlap=Overlap(p2p=False))
    serial = plan_parallel(profile, req).plan
    assert serial.dp_comm_s == pytest.approx(0.060) and serial.allreduce_s == pytest.approx(0.060)
    bf16 = plan_parallel(profile, dataclasses.replace(req, grad_reduce_fp32=False)).plan
    assert bf16.dp_comm_s == pytest.approx(0.040)
    overlapped = plan_parallel(profile, dataclasses.replace(req, overlap=None)).plan  # Megatron's own overlaps
    assert overlapped.overlap.grad_reduce and overlapped.overlap.param_gather
    assert overlapped.allreduce_s == pytest.approx(0.0204 + 0.0102)
    assert overlapped.grad_reduce_ratio == 2.0 and bf16.grad_reduce_ratio == 1.0  # what config tells Megatron
    fp32_weights = plan_parallel(dataclasses.replace(profile, dtype="float32"), req).plan  # Megatron: bf16 only
    assert fp32_weights.dp_comm_s == pytest.approx(0.040)
    # and it keeps the gradients it reduces in fp32: 2 + 4 + 12/2 = 12 bytes a parameter under its
    # distributed optimizer (dist_optimizer.md: "bf16 parameters, fp32 gradients | 6 + 12/d"), 2 + 2 + 12/2 in bf16
    assert serial.stages[0].static_bytes == pytest.approx(12 * 2e9)
    assert bf16.stages[0].static_bytes == pytest.approx(10 * 2e9)
