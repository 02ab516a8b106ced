"""Tensor x pipeline x data parallel: the choice against brute force, the 3D search against every
pinned degree and its pruning against a search of the best split alone, old plans load."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.costs.tensor import TransformerShape
from autopipe.errors import InfeasibleError, PlanError
from autopipe.graph.recipe import TraceRecipe
from autopipe.modes import Sharding
from autopipe.planner.parallel import (
    Cluster,
    Layout,
    ParallelPlan,
    ParallelRequest,
    TensorOptions,
    layouts,
    plan_parallel,
    ring_allreduce_s,
)
from autopipe.planner.request import Choices
from autopipe.planner.search import PlanRequest, plan_pipeline
from autopipe.plans import Overlap, Plan

GB = 1e9


def chain_profile(n: int = 8, params: int = 10**8, f: float = 1e-3, act: float = 1e8) -> Profile:
    """``n`` equal blocks in a chain: ``params`` fp32 parameters each, forward ``f`` s per sample."""
    blocks = tuple(
        BlockCost(
            name=f"layers.{i}",
            nodes=(f"n{i}",),
            params=params,
            param_bytes=4 * params,
            forward_s=Affine(0.0, f),
            backward_s=Affine(0.0, 2 * f),
            backward_input_s=Affine(0.0, f),
            backward_weight_s=Affine(0.0, f),
            saved_bytes=Affine(0.0, act),
        )
        for i in range(n)
    )
    tensors = tuple(TensorCost(f"n{i}", i, (i + 1,), Affine(0.0, 1e6)) for i in range(n - 1))
    return Profile(
        model="chain",
        recipe=TraceRecipe(tracer="fx", fingerprint="x"),
        device="synthetic",
        torch_version="",
        dtype="float32",
        micro_batch_sizes=(1, 2),
        method="analytic",
        blocks=blocks,
        tensors=tensors,
    )


CLUSTER = Cluster(
    devices=8, devices_per_node=4, nvlink_bandwidth=100 * GB, network_bandwidth=10 * GB, link_latency_s=0.0
)


def _brute_force(profile: Profile, req: ParallelRequest) -> dict[tuple[int, int, str], float]:
    """Step time of every (S, D, placement) that fits, by calling plan_pipeline directly."""
    out = {}
    G = req.cluster.devices
    for S in (s for s in range(1, G + 1) if G % s == 0):
        D = G // S
        for lay in layouts(S, D, req.cluster):
            try:
                plan = plan_pipeline(
                    profile,
                    PlanRequest(
                        devices=S,
                        batch_size=req.global_batch // D,
                        memory_limit=req.memory_limit,
                        link_bandwidth=lay.p2p_bandwidth,
                        link_latency_s=0.0,
                    ),
                )
            except PlanError:
                continue
            grad = max(sum(st.params * 4 for st in plan.stages if st.rank == r) for r in range(S))
            out[(S, D, lay.placement)] = plan.iteration_time_s + ring_allreduce_s(grad, D, lay.allreduce_bandwidth)
    return out


@pytest.mark.parametrize(("memory", "network"), [(64 * GB, 10 * GB), (64 * GB, 0.05 * GB), (12 * GB, 10 * GB)])
def test_choice_is_the_fastest_layout_that_fits_and_the_runner_up_another_depth(memory: float, network: float) -> None:
    profile = chain_profile()
    cluster = dataclasses.replace(CLUSTER, network_bandwidth=network, nvlink_bandwidth=max(network, 100 * GB))
    req = ParallelRequest(cluster, global_batch=64, memory_limit=memory)
    result = plan_parallel(profile, req)
    brute = _brute_force(profile, req)
    best = min(brute.values())
    assert result.best.step_time_s == pytest.approx(best, rel=1e-9)
    lay = result.best.layout
    assert brute[(lay.stages, lay.data_parallel, lay.placement)] == pytest.approx(best, rel=1e-9)
    others = [t for (s, _, _), t in brute.items() if s != lay.stages]
    if others:
        assert result.runner_up is not None and result.runner_up.layout.stages != lay.stages
        assert result.runner_up.step_time_s == pytest.approx(min(others), rel=1e-9)
    plan = result.plan
    assert plan.data_parallel == lay.data_parallel and plan.devices == lay.stages
    assert plan.throughput == pytest.approx(64 / plan.step_time_s)
    assert all(m <= memory * (1 + 1e-9) for m in plan.peak_memory_bytes)
    assert "runner-up" in plan.parallel_note


def test_a_slow_network_pushes_toward_deeper_pipelines() -> None:
    profile = chain_profile()
    fast = plan_parallel(
        profile, ParallelRequest(dataclasses.replace(CLUSTER, network_bandwidth=100 * GB), 64, 64 * GB)
    )
    slow = plan_parallel(
        profile,
        ParallelRequest(
            dataclasses.replace(CLUSTER, network_bandwidth=0.01 * GB, nvlink_bandwidth=0.01 * GB), 64, 64 * GB
        ),
    )
    assert slow.best.layout.data_parallel <= fast.best.layout.data_parallel
    assert slow.best.layout.data_parallel == 1  # an all-reduce over 0.01 GB/s costs more than any bubble


def test_sharding_the_optimizer_lets_wider_data_parallelism_fit() -> None:
    profile = chain_profile(act=1e6)
    # 8 blocks x 1e8 params x 16 B = 12.8 GB; on 4 stages 3.2 GB per stage plus activations.
    plain = ParallelRequest(CLUSTER, global_batch=64, memory_limit=3.0 * GB, sharding=Sharding.NONE)
    sharded = dataclasses.replace(plain, sharding=None, shard_optimizer=True)
    unfit_plain = {r.stages for r in plan_parallel(profile, plain).rejected}
    unfit_sharded = {r.stages for r in plan_parallel(profile, sharded).rejected}
    assert 4 in unfit_plain and unfit_sharded < unfit_plain  # S=4 x D=2 fits only sharded
    plan = plan_parallel(profile, sharded).plan
    assert plan.shard_optimizer == (plan.data_parallel > 1) and Plan.from_json(plan.to_json()) == plan


def test_nothing_fits_names_the_deepest_pipeline_need() -> None:
    with pytest.raises(InfeasibleError, match=r"no split of 8 devices .* fits"):
        plan_parallel(chain_profile(), ParallelRequest(CLUSTER, global_batch=64, memory_limit=0.1 * GB))


def test_pinned_depth_and_bad_requests() -> None:
    r = plan_parallel(chain_profile(), ParallelRequest(CLUSTER, global_batch=64, memory_limit=64 * GB, stages=4))
    assert (r.best.layout.stages, r.best.layout.data_parallel) == (4, 2)
    with pytest.raises(PlanError, match="does not divide 8 devices"):
        plan_parallel(chain_profile(), ParallelRequest(CLUSTER, global_batch=64, memory_limit=64 * GB, stages=3))
    # A batch that does not split evenly over the replicas rules those layouts out.
    r = plan_parallel(chain_profile(), ParallelRequest(CLUSTER, global_batch=6, memory_limit=64 * GB))
    assert 6 % r.best.layout.data_parallel == 0
    assert any("does not split" in x.reason for x in r.rejected)


def test_plans_keep_loading_without_the_data_parallel_fields() -> None:
    plan = plan_parallel(chain_profile(), ParallelRequest(CLUSTER, global_batch=64, memory_limit=64 * GB)).plan
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.step_time_s == pytest.approx(plan.iteration_time_s + plan.allreduce_s)
    raw = json.loads(plan.to_json())
    for key in ("data_parallel", "allreduce_s", "parallel_note"):
        del raw[key]
    old = Plan.from_json(json.dumps(raw))
    assert old.data_parallel == 1 and old.allreduce_s == 0.0 and math.isclose(old.step_time_s, old.iteration_time_s)


def test_layout_is_a_value() -> None:
    assert Layout(2, 4, "one node", 1.0, 1.0) == Layout(2, 4, "one node", 1.0, 1.0)


# --------------------------------------------------------------------------- tensor parallel


def _tensor(profile: Profile, heads: int = 4) -> TensorOptions:
    """A synthetic Megatron split: compute, parameters and activations / t, plus a fixed
    collective cost per block and micro-batch that grows with t."""
    shape = TransformerShape(64, heads, heads, 16, 0, tuple(b.name for b in profile.blocks))

    def price(t: int) -> Profile:
        def one(b: BlockCost) -> BlockCost:
            comm = 2e-4 * (t - 1) / t
            return dataclasses.replace(
                b,
                params=b.params // t,
                param_bytes=b.param_bytes // t,
                forward_s=Affine(comm, b.forward_s.slope / t),
                backward_s=Affine(comm, b.backward_s.slope / t),
                backward_input_s=Affine(comm, b.backward_input_s.slope / t),
                backward_weight_s=Affine(0.0, b.backward_weight_s.slope / t),
                saved_bytes=Affine(0.0, b.saved_bytes.slope / t),
            )

        return profile if t == 1 else dataclasses.replace(profile, blocks=tuple(one(b) for b in profile.blocks))

    return TensorOptions(shape, price)


NODES = Cluster(
    devices=16, devices_per_node=8, nvlink_bandwidth=100 * GB, network_bandwidth=10 * GB, link_latency_s=0.0
)


@pytest.mark.parametrize("memory", [64 * GB, 6 * GB])
def test_the_free_3d_search_is_the_best_of_every_pinned_degree(memory: float) -> None:
    profile, req = chain_profile(), ParallelRequest(NODES, global_batch=64, memory_limit=memory)
    tensor = _tensor(profile)
    free = plan_parallel(profile, req, tensor=tensor)
    pinned = {}
    for t in (1, 2, 4):
        try:
            pinned[t] = plan_parallel(
                profile, dataclasses.replace(req, tensor_parallel=t), tensor=tensor
            ).best.step_time_s
        except InfeasibleError:
            continue
    assert free.best.step_time_s == pytest.approx(min(pinned.values()), rel=1e-12)
    assert all(free.best.step_time_s <= s * (1 + 1e-12) for s in pinned.values())
    lay, plan = free.best.layout, free.plan
    assert (
        lay.tensor_parallel * lay.stages * lay.data_parallel == 16 and NODES.devices_per_node % lay.tensor_parallel == 0
    )
    assert (plan.tensor_parallel, plan.devices, plan.data_parallel) == (
        lay.tensor_parallel,
        lay.stages,
        lay.data_parallel,
    )
    assert plan.sequence_parallel == (lay.tensor_parallel > 1)
    assert any(r.tensor_parallel == 8 and "does not divide the 4 attention heads" in r.reason for r in free.rejected)
    assert Plan.from_json(plan.to_json()) == plan  # the new fields round-trip


@pytest.mark.slow
def test_pruning_keeps_the_best_and_the_runner_up_exact() -> None:
    profile = chain_profile(n=16)
    req = ParallelRequest(NODES, global_batch=64, memory_limit=64 * GB)
    result = plan_parallel(profile, req, tensor=_tensor(profile))
    every = []
    for t in (1, 2, 4):
        for S in (1, 2, 4, 8, 16):
            if 16 % (t * S) == 0:
                pin = dataclasses.replace(req, tensor_parallel=t, stages=S)
                every.append((plan_parallel(profile, pin, tensor=_tensor(profile)).best.step_time_s, t, S))
    every.sort()
    assert result.best.step_time_s == pytest.approx(every[0][0], rel=1e-12)
    other = min(s for s, t, S in every if (t, S) != (result.best.layout.tensor_parallel, result.best.layout.stages))
    assert result.runner_up is not None and result.runner_up.step_time_s == pytest.approx(other, rel=1e-12)


def test_tensor_parallel_stays_in_a_node_and_divides_the_heads() -> None:
    profile = chain_profile()
    small = dataclasses.replace(NODES, devices_per_node=2)
    result = plan_parallel(
        profile, ParallelRequest(small, global_batch=64, memory_limit=64 * GB), tensor=_tensor(profile)
    )
    assert result.best.layout.tensor_parallel <= 2
    with pytest.raises(
        PlanError,
        match="--tensor-parallel 4: a tensor-parallel group stays within a node; 4 does not divide 2 devices per node",
    ):
        plan_parallel(profile, ParallelRequest(small, 64, 64 * GB, tensor_parallel=4), tensor=_tensor(profile))
    with pytest.raises(PlanError, match="--tensor-parallel 4: 4 does not divide the 6 attention heads"):
        plan_parallel(profile, ParallelRequest(NODES, 64, 64 * GB, tensor_parallel=4), tensor=_tensor(profile, heads=6))
    with pytest.raises(PlanError, match="--tensor-parallel 2: the model has no transformer layers"):
        plan_parallel(profile, ParallelRequest(NODES, 64, 64 * GB, tensor_parallel=2))


def test_t1_is_todays_search() -> None:
    profile, req = chain_profile(), ParallelRequest(CLUSTER, global_batch=64, memory_limit=64 * GB)
    today = plan_parallel(profile, req)
    odd = plan_parallel(profile, req, tensor=_tensor(profile, heads=7))  # 7 heads: only t = 1
    assert (odd.best, odd.runner_up) == (today.best, today.runner_up)
    assert {(r.tensor_parallel, r.reason) for r in odd.rejected if r.tensor_parallel > 1} == {
        (2, "2 does not divide the 7 attention heads"),
        (4, "4 does not divide the 7 attention heads"),
    }
    assert plan_parallel(profile, dataclasses.replace(req, tensor_parallel=1), tensor=_tensor(profile)) == today
    assert today.plan.tensor_parallel == 1 and not today.plan.sequence_parallel


def test_a_group_sends_its_shards_in_parallel_and_pins_hold() -> None:
    (lay,) = layouts(4, 1, NODES, tensor_parallel=4)  # 2 slots per node: 4 stages span 2 nodes
    assert lay.placement == "pipeline across nodes" and lay.p2p_bandwidth == 4 * 10 * GB
    (inner,) = layouts(2, 1, NODES, tensor_parallel=4)
    assert inner.placement == "one node" and inner.p2p_bandwidth == 4 * 100 * GB
    profile = chain_profile()
    req = ParallelRequest(NODES, 64, 64 * GB, tensor_parallel=2, stages=2, data_parallel=4)
    lay = plan_parallel(profile, req, tensor=_tensor(profile)).best.layout
    assert (lay.tensor_parallel, lay.stages, lay.data_parallel) == (2, 2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("worst_first", [False, True])
def test_searching_against_the_runner_up_keeps_the_whole_plan(
    worst_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Splits searched with the runner-up as the time to beat (the best one searched again in
    full when it was one of them) give the plan a search of the best split alone gives: cuts,
    schedule, runners-up; in any order the splits are opened."""
    import autopipe.planner.parallel as parallel

    if worst_first:  # the best split is then searched against the others' runner-up
        monkeypatch.setattr(parallel, "_estimate", lambda profile, request, S, D, bound, *rest: -bound)
    profile = chain_profile(n=16, act=4e8)
    req = ParallelRequest(NODES, global_batch=64, memory_limit=64 * GB)
    free = plan_parallel(profile, req, tensor=_tensor(profile))
    lay = free.best.layout
    alone = plan_parallel(
        profile,
        dataclasses.replace(req, tensor_parallel=lay.tensor_parallel, stages=lay.stages),
        tensor=_tensor(profile),
    )
    assert dataclasses.replace(free.plan, parallel_note="") == dataclasses.replace(alone.plan, parallel_note="")
    assert free.runner_up is not None and (free.pruned > 0 or worst_first)


# --------------------------------------------------------------------------- sharding


def _pinned(profile: Profile, req: ParallelRequest, **kw: object) -> ParallelPlan | None:
    try:
        return plan_parallel(profile, dataclasses.replace(req, **kw))  # type: ignore[arg-type]
    except InfeasibleError:
        return None


@pytest.mark.parametrize("memory", [64 * GB, 3.0 * GB, 2.2 * GB])
def test_the_free_sharding_is_the_best_pinned_one_and_fits(memory: float) -> None:
    """Every sharding pinned in turn (over all replicas, and over a node's): the free search's
    step is the least of them, and every plan it returns fits the limit."""
    profile = chain_profile(act=1e6)
    req = ParallelRequest(CLUSTER, global_batch=64, memory_limit=memory)
    free = plan_parallel(profile, req)
    pinned = {}
    for kind in Sharding:
        for group in (None, 2):
            if kind == Sharding.NONE and group is not None:
                continue
            got = _pinned(profile, req, sharding=kind, shard_group=group)
            if got is not None:
                pinned[kind, group] = got.best.step_time_s
                assert all(m <= memory * (1 + 1e-9) for m in got.plan.peak_memory_bytes)
                assert got.plan.sharding in (kind, Sharding.NONE) and got.plan.shard_group in (0, group or 0)
    assert free.best.step_time_s == pytest.approx(min(pinned.values()), rel=1e-9)
    assert all(m <= memory * (1 + 1e-9) for m in free.plan.peak_memory_bytes)
    assert Plan.from_json(free.plan.to_json()) == free.plan


def test_sharding_is_found_without_a_pin_where_memory_needs_it() -> None:
    profile = chain_profile(act=1e6)
    tight = ParallelRequest(CLUSTER, global_batch=64, memory_limit=2.6 * GB, stages=4)  # 3.2 GB whole, 2.4 ZeRO-1
    plain = _pinned(profile, tight, sharding=Sharding.NONE)
    found = plan_parallel(profile, tight).plan
    assert plain is None or plain.best.layout.data_parallel == 1  # 4 stages x 2 replicas do not fit whole
    assert found.data_parallel == 2 and found.sharding != Sharding.NONE and found.shard_optimizer
    loose = plan_parallel(profile, dataclasses.replace(tight, memory_limit=64 * GB)).plan
    assert loose.sharding == Sharding.NONE  # ties go to the least sharded: none needs no flag


def test_a_pinned_sharding_and_group_are_kept() -> None:
    profile = chain_profile(act=1e6)
    req = ParallelRequest(CLUSTER, global_batch=64, memory_limit=64 * GB, stages=2)
    for kind in (Sharding.ZERO2, Sharding.ZERO3, Sharding.ZERO3_STEP):
        plan = plan_parallel(profile, dataclasses.replace(req, sharding=kind)).plan
        assert (plan.data_parallel, plan.sharding, plan.shard_group) == (4, kind, 0)
        hybrid = plan_parallel(profile, dataclasses.replace(req, sharding=kind, shard_group=2)).plan
        assert (hybrid.sharding, hybrid.shard_group) == (kind, 2)
    with pytest.raises(PlanError, match=r"--shard-group 3 does not divide 4 replicas"):
        plan_parallel(profile, dataclasses.replace(req, sharding=Sharding.ZERO1, shard_group=3))


def test_targets_search_only_the_shardings_they_run() -> None:
    profile = chain_profile(act=1e6)
    req = ParallelRequest(CLUSTER, global_batch=64, memory_limit=2.6 * GB, stages=4)
    titan = plan_parallel(profile, dataclasses.replace(req, choices=Choices(target="torchtitan"))).plan
    assert titan.sharding in (Sharding.NONE, Sharding.ZERO3_STEP)  # FSDP2 with a pipeline gathers once a step
    with pytest.raises(PlanError, match=r"--sharding zero1: torchtitan runs none or zero3-step with a pipeline"):
        plan_parallel(profile, dataclasses.replace(req, sharding=Sharding.ZERO1, choices=Choices(target="torchtitan")))


def _one_block(f: float, params: int) -> Profile:
    """One block, forward ``f`` and backward ``2 f`` seconds per micro-batch whatever its size."""
    block = dataclasses.replace(
        chain_profile(n=1).blocks[0],
        params=params,
        param_bytes=4 * params,
        forward_s=Affine(f, 0.0),
        backward_s=Affine(2 * f, 0.0),
        backward_input_s=Affine(f, 0.0),
        backward_weight_s=Affine(f, 0.0),
        saved_bytes=Affine(0.0, 0.0),
    )
    return dataclasses.replace(chain_profile(n=1), blocks=(block,), tensors=())


@pytest.mark.parametrize(("f", "hidden"), [(1.0, True), (0.01, False)])
def test_the_all_reduce_hides_behind_the_last_backward(f: float, hidden: bool) -> None:
    """One stage, 2 replicas on NVLink (100 GB/s), one micro-batch: F [0, f], B [f, 3f]; 8 GB of
    gradients all-reduce in 2 x 1/2 x 8 GB / 100 GB/s = 80 ms: behind a 2 s backward, hidden;
    behind a 20 ms one, 60 ms stick out. Serial, all 80 ms come after the pipeline."""
    profile = _one_block(f, 2 * 10**9)
    two = dataclasses.replace(CLUSTER, devices=2)  # one node: NVLink
    req = ParallelRequest(
        two, global_batch=2, memory_limit=1e15, stages=1, sharding=Sharding.NONE, choices=Choices(micro_batches=1)
    )
    serial = plan_parallel(profile, req).plan
    assert serial.iteration_time_s == pytest.approx(3 * f) and serial.allreduce_s == pytest.approx(0.08)
    overlapped = plan_parallel(profile, dataclasses.replace(req, overlap=Overlap(grad_reduce=True))).plan
    assert overlapped.dp_comm_s == pytest.approx(0.08) and overlapped.overlap.grad_reduce
    assert overlapped.allreduce_s == pytest.approx(0.0 if hidden else 0.08 - 2 * f)


def test_zero3_blocks_gather_their_weights_each_micro_batch() -> None:
    """ZeRO-3 over 2 replicas on NVLink: the 8 GB block gathers half of it in the forward and again in
    the backward, and reduce-scatters its gradients: 40 ms each, serial, on every micro-batch."""
    profile = _one_block(1.0, 2 * 10**9)
    two = dataclasses.replace(CLUSTER, devices=2)  # one node: NVLink
    req = ParallelRequest(
        two, global_batch=4, memory_limit=1e15, stages=1, sharding=Sharding.ZERO3, choices=Choices(micro_batches=2)
    )
    plan = plan_parallel(profile, req).plan
    stage = plan.stages[0]
    assert stage.forward_s == pytest.approx(1.0 + 0.04) and stage.backward_s == pytest.approx(2.0 + 0.08)
    assert plan.iteration_time_s == pytest.approx(2 * 3.12) and plan.allreduce_s == 0.0
    assert stage.static_bytes == pytest.approx(16 * 2e9 / 2)  # 16 bytes a parameter, halved
    hidden = plan_parallel(profile, dataclasses.replace(req, overlap=Overlap(grad_reduce=True, param_gather=True)))
    assert hidden.plan.stages[0].forward_s == pytest.approx(1.0)  # 40 ms under a 1 s forward
