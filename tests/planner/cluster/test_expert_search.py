"""Expert and context parallelism in the cluster search (planner/cluster/experts.py and its use in
planner/parallel.py): the degrees searched, Megatron-Core's divisibility rules, the state of a
layout sharded over two groups, the all-to-all hidden, and the search's choices on small cases
checked by hand."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autopipe.costs.activations.choices import MemoryChoice, apply
from autopipe.costs.context import ContextShape
from autopipe.costs.experts import MoEShape
from autopipe.costs.options import Layout, Links, ParallelOptions
from autopipe.costs.profile import Affine, ExpertTimes, MemoryOption, Profile
from autopipe.errors import PlanError
from autopipe.modes import Recompute, Sharding
from autopipe.planner.cluster.experts import (
    MIN_CONTEXT_TOKENS,
    Pair,
    Unpaired,
    _Hidden,
    context_degrees,
    dominated,
    expert_degrees,
    exposed,
    hidden_profile,
    hiding_choices,
    state_profile,
)
from autopipe.planner.parallel import Cluster, ParallelRequest, plan_parallel
from autopipe.planner.request import Choices
from tests.helpers import ROOT
from tests.planner.test_parallel import chain_profile

GB = 1e9
DENSE, EXPERT = 10**8, 8 * 10**8  # parameters per block: the dense ones and all the routed experts'
CLUSTER = Cluster(devices=8, devices_per_node=8, nvlink_bandwidth=100 * GB, network_bandwidth=10 * GB)


def _moe_profile(ep: int) -> Profile:
    """4 blocks of a MoE on one device of an ep-wide expert group: ``DENSE`` + ``EXPERT / ep``
    fp32 parameters each, the experts' marked; times as chain_profile's, whatever ep."""
    base = chain_profile(4, DENSE)
    mine = EXPERT // ep
    blocks = tuple(
        replace(b, params=DENSE + mine, param_bytes=4 * (DENSE + mine), expert_params=mine) for b in base.blocks
    )
    return replace(base, blocks=blocks)


def _options(experts: int = 4, seq: int = 64) -> ParallelOptions:
    shape = MoEShape(experts, 1, 16, seq, (EXPERT,) * 4, (1,) * 4)
    return ParallelOptions(
        None,
        ContextShape(32, seq),
        shape,
        Links(8, 100 * GB, 10 * GB),
        lambda lay: _moe_profile(lay.ep),
        lambda lay, u: (0.0, 0.0),
    )


def test_context_parallel_is_searched_where_each_rank_keeps_enough_tokens() -> None:
    long = _options(seq=4 * MIN_CONTEXT_TOKENS)
    ok, skipped = context_degrees(long, 16, 1, None)
    assert ok == [1, 2, 4]  # 16384 tokens: 4096 per rank at cp 4, the least searched
    assert dict(skipped)[8] == f"leaves 2048 tokens per rank, under {MIN_CONTEXT_TOKENS} (pin it to search it)"
    assert context_degrees(long, 16, 1, 8) == ([8], [])  # pinned: searched all the same
    assert context_degrees(_options(seq=64), 16, 1, None)[0] == [1]  # a short sequence: never split
    with pytest.raises(PlanError, match=r"^--context-parallel 3: t=1 x cp=3 does not divide 16 devices; pick"):
        context_degrees(long, 16, 1, 3)
    with pytest.raises(PlanError, match=r"sequence of 16384 tokens does not split into 2 x 3 equal chunks"):
        context_degrees(long, 12, 1, 3)  # Megatron's 2 cp chunks


def test_expert_degrees_follow_megatron_cores_divisibility_rules() -> None:
    options = _options(experts=6)
    # E = 6 experts on a stage of 16 devices: ep divides both, so 1 and 2 only (3, 6 do not divide 16)
    assert expert_degrees(options, 1, 1, 16, (None, None)) == [(1, 1), (2, 1)]
    assert expert_degrees(_options(experts=8), 1, 1, 8, (None, None)) == [(1, 1), (2, 1), (4, 1), (8, 1)]
    # etp x ep must divide the stage's t cp d devices: etp 2 leaves 4 slots for ep
    assert expert_degrees(_options(experts=8), 1, 1, 8, (None, 2)) == [(1, 2), (2, 2), (4, 2)]
    assert expert_degrees(_options(experts=8), 1, 1, 8, (8, 2)) == []  # 8 x 2 = 16 > 8 devices
    dense = replace(options, experts=None)
    assert expert_degrees(dense, 1, 1, 16, (None, None)) == [(1, 1)]


def test_state_profile_shards_dense_and_expert_state_over_their_own_groups() -> None:
    # ZeRO-1 over d cp = 8 devices (dense) and t cp d / (ep etp) = 8 / 2 = 4 (experts): per stored
    # parameter of e = 4 bytes and b = 16 bytes of state, 2e + (b - 2e) / N bytes: 9 and 10
    profile = _moe_profile(2)
    state, factor = state_profile(profile, Layout(ep=2), 8, Sharding.ZERO1, 8, 16.0)
    assert factor == pytest.approx(9.0 / 4.0)
    dense_bytes, expert_bytes = 4 * DENSE, 4 * EXPERT // 2
    for b in state.blocks:
        assert b.param_bytes * factor == pytest.approx(dense_bytes * 9 / 4 + expert_bytes * 10 / 4, rel=1e-9)
        assert b.params == DENSE + EXPERT // 2  # the parameters themselves as they were
    # without sharding, or with no experts, the profile itself
    assert state_profile(profile, Layout(ep=2), 8, Sharding.NONE, 8, 16.0) == (profile, 4.0)
    assert state_profile(chain_profile(4), Layout(cp=2), 4, Sharding.ZERO1, 4, 16.0)[1] == pytest.approx(
        (8 + 8 / 8) / 4
    )  # the dense state over d cp = 8 devices


def _streams(p: Pair) -> float:
    """The pair's time from a list schedule of Megatron-Core's two streams, each in order, an op
    starting once its stream is free and what it needs is done (written apart from ``exposed``)."""
    compute = [("attn F", p.attention), ("experts dB", p.experts_grad), ("experts wB", p.experts_wgrad)]
    compute += [("experts F", p.experts), ("attn B", p.attention_grad)]
    comm = [("combine B", p.combine_grad), ("dispatch F", p.dispatch), ("dispatch B", p.dispatch_grad)]
    comm += [("combine F", p.combine)]
    needs = {
        "experts dB": "combine B",
        "dispatch F": "attn F",
        "experts F": "dispatch F",
        "dispatch B": "experts dB",
        "attn B": "dispatch B",
        "combine F": "experts F",
    }
    done: dict[str, float] = {}
    free = {"compute": 0.0, "comm": 0.0}
    queues = {"compute": list(compute), "comm": list(comm)}
    while queues["compute"] or queues["comm"]:
        for stream, queue in queues.items():
            while queue and (queue[0][0] not in needs or needs[queue[0][0]] in done):
                name, seconds = queue.pop(0)
                start = max(free[stream], done.get(needs.get(name, ""), 0.0))
                done[name] = free[stream] = start + seconds
    return max(free.values())


def test_exposed_pairs_each_all_to_all_with_the_sub_module_beside_it() -> None:
    # combine B beside attention F: 1.5 - 1 = 0.5 (backward); dispatch F beside the experts' backward
    # (1 + 1): 3 - 2 = 1; the experts' forward done at max(2, 3) + 2 = 5, dispatch B (after the
    # experts' dgrad) at max(3, 1) + 2 = 5: hidden; combine F beside attention B: 4 - 3 = 1
    pair = Pair(1.0, 2.0, 3.0, 1.0, 1.0, dispatch=3.0, combine=4.0, dispatch_grad=2.0, combine_grad=1.5)
    assert exposed(pair) == pytest.approx((2.0, 0.5))
    # dispatch B waits for the experts' dgrad (2) and runs 3 beside the wgrad and experts F (0.5 + 0.5): 2
    late = Pair(1.0, 0.5, 1.0, 2.0, 0.5, dispatch=1.0, combine=0.5, dispatch_grad=3.0, combine_grad=1.0)
    assert exposed(late) == pytest.approx((0.0, 2.0))
    assert exposed(Pair(1.0, 1.0, 2.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5)) == (0.0, 0.0)  # every one hidden
    # the all-to-all kernels holding a quarter of the SMs: attention F (1) beside combine B (2) runs at
    # 0.75, done at 1.33, waits to 2: 1 charged; attention F of 3 does 1.5 in those 2, 1.5 after: 0.5
    assert exposed(Pair(1.0, 0, 0, 0, 0, 0, 0, 0, combine_grad=2.0), share=0.25) == pytest.approx((0.0, 1.0))
    assert exposed(Pair(3.0, 0, 0, 0, 0, 0, 0, 0, combine_grad=2.0), share=0.25) == pytest.approx((0.0, 0.5))
    assert sum(exposed(pair, share=0.25)) > sum(exposed(pair))
    pieces = (pair, late, Pair(0.1, 0.2, 0.3, 0.4, 0.0, 0.9, 0.1, 0.2, 0.8))
    for p in pieces:  # a list schedule of the two streams agrees
        computed = p.attention + p.experts + p.attention_grad + p.experts_grad + p.experts_wgrad
        assert _streams(p) == pytest.approx(computed + sum(exposed(p)))


def test_the_hidden_all_to_all_hides_behind_the_paired_sub_modules() -> None:
    # forward 1 ms per sample, backward 2, input-gradient 1; the routed experts 0.4, 0.8 (0.4 dgrad)
    profile = _moe_profile(2)
    routed = ExpertTimes(Affine(0.0, 0.4e-3), Affine(0.0, 0.8e-3), Affine(0.0, 0.4e-3))
    moe = replace(profile, blocks=tuple(replace(b, experts_s=routed) for b in profile.blocks))
    hidden = hidden_profile(moe, lambda u: (0.2e-3 * u, 0.3e-3 * u))  # dispatch 0.2, combine 0.3 (0.3 back)
    assert hidden is not None
    b = hidden.blocks[0]
    # pieces at u = 1: attention 1 - 0.5 - 0.4 = 0.1, attention B 2 - 0.6 - 0.8 = 0.6: combine B waits
    # 0.3 - 0.1 = 0.2, the rest hides; forward 1 - 0.5 = 0.5, backward 2 - 0.6 + 0.2 = 1.6; the
    # input-gradient one (no wgrad, attention dgrad 1 - 0.6 - 0.4 = 0): 1 - 0.6 + 0.2 = 0.6 (behind the
    # whole other micro-batch, the backward's 0.6 would hide behind the forward's 0.5: 1.5)
    assert (b.forward_s(1.0), b.backward_s(1.0), b.backward_input_s(1.0)) == pytest.approx((0.5e-3, 1.6e-3, 0.6e-3))
    assert b.backward_s(2.0) == pytest.approx(3.2e-3)  # all of it linear in u
    # a recomputed forward joins the backward before the dispatch: 2.5 - 0.6, combine F still hidden,
    # as the planner's selective recomputation adds it (it once dropped the hiding: a plain line)
    again = MemoryOption(recompute=("core_attn",), saved_bytes=Affine(0.0, 1e7), recompute_s=Affine(0.0, 0.5e-3))
    kept = replace(hidden, blocks=tuple(replace(x, memory=(again,)) for x in hidden.blocks))
    recomputed = apply(kept, MemoryChoice(recompute=("core_attn",))).blocks[0]
    assert (recomputed.backward_s(1.0), recomputed.backward_input_s(1.0)) == pytest.approx((2.1e-3, 1.1e-3))
    # the experts' compute not known (measured): all of it before the dispatch, so dispatch F (0.2)
    # has nothing beside it and dispatch B (0.3) nothing either: forward 0.7, backward 1.7
    unknown = hidden_profile(profile, lambda u: (0.2e-3 * u, 0.3e-3 * u))
    assert unknown is not None
    assert (unknown.blocks[0].forward_s(1.0), unknown.blocks[0].backward_s(1.0)) == pytest.approx((0.7e-3, 1.7e-3))
    assert hidden_profile(profile, lambda u: (0.0, 0.0)) is None
    with pytest.raises(ValueError, match=r"the all-to-all's share of the SMs must be in \[0, 1\) \(got 1.0\)"):
        hidden_profile(profile, lambda u: (0.2e-3 * u, 0.3e-3 * u), share=1.0)


def test_the_warm_up_and_cool_down_chunks_pay_their_all_to_all_in_the_open() -> None:
    # Megatron-Core's interleaved 1F1B with the overlap on the first of p = 8 ranks, v = 4, 128
    # micro-batches: 2 (8 - 1) + (4 - 1) 8 + 1 = 39 warm-up forwards of 512 chunk forwards
    alone = Unpaired.interleaved(8, 4, 8192, 64)  # counts kept times the 64 replicas
    assert (alone.warmup, alone.chunks) == (39.0 * 64, 512.0 * 64)
    assert alone.fraction(1.0) == pytest.approx(39 / 512)
    assert alone.fraction(2.0) == pytest.approx(78 / 512)  # half the micro-batches, twice the share
    assert alone.fraction(64.0) == 1.0  # two micro-batches: none paired
    assert Unpaired.interleaved(8, None, 8192, 64).fraction(1.0) == pytest.approx(8 / 128)  # v unpinned: p / m
    # unpinned, one share for every split of the same devices (S x D): one hidden profile for them
    assert Unpaired.interleaved(16, None, 8192, 32) == Unpaired.interleaved(8, None, 8192, 64)
    assert Unpaired(3.0, 0.0).fraction(1.0) == 0.0
    # the profile of the test above: forward 1 ms open, 0.5 hidden; backward 2 open, 1.6 hidden
    profile = _moe_profile(2)
    routed = ExpertTimes(Affine(0.0, 0.4e-3), Affine(0.0, 0.8e-3), Affine(0.0, 0.4e-3))
    moe = replace(profile, blocks=tuple(replace(b, experts_s=routed) for b in profile.blocks))
    hidden = hidden_profile(moe, lambda u: (0.2e-3 * u, 0.3e-3 * u), unpaired=Unpaired(1.0, 4.0))
    assert hidden is not None
    b = hidden.blocks[0]
    # a quarter unpaired at u = 1: forward 1 - 0.75 x 0.5 = 0.625, backward 2 - 0.75 x 0.4 = 1.7
    assert (b.forward_s(1.0), b.backward_s(1.0)) == pytest.approx((0.625e-3, 1.7e-3))
    assert (b.forward_s(4.0), b.backward_s(4.0)) == pytest.approx((4e-3, 8e-3))  # all unpaired: as priced open
    again = MemoryOption(recompute=("core_attn",), saved_bytes=Affine(0.0, 1e7), recompute_s=Affine(0.0, 0.5e-3))
    kept = replace(hidden, blocks=tuple(replace(x, memory=(again,)) for x in hidden.blocks))
    recomputed = apply(kept, MemoryChoice(recompute=("core_attn",))).blocks[0]
    assert recomputed.backward_s(4.0) == pytest.approx(10e-3)  # the recomputed forward keeps the unpaired share


def test_a_hidden_time_is_worked_out_once_per_size_and_never_differs() -> None:
    # the search asks a hidden block's time at the same few sizes millions of times (DeepSeek-V3's
    # full search: 2.4M walks of the two streams): each size walked once, the value bit for bit
    # the walk's, and the memo no part of the cost's equality, hash or replace
    profile = _moe_profile(2)
    routed = ExpertTimes(Affine(0.0, 0.4e-3), Affine(0.0, 0.8e-3), Affine(0.0, 0.4e-3))
    moe = replace(profile, blocks=tuple(replace(b, experts_s=routed) for b in profile.blocks))
    hidden = hidden_profile(moe, lambda u: (0.2e-3 * u + 1e-5, 0.3e-3 * u), share=0.2)
    twin = hidden_profile(moe, lambda u: (0.2e-3 * u + 1e-5, 0.3e-3 * u), share=0.2)
    assert hidden is not None and twin is not None
    for cost in (hidden.blocks[0].forward_s, hidden.blocks[0].backward_s, hidden.blocks[0].backward_input_s):
        assert isinstance(cost, _Hidden)
        for u in (1, 2.0, 3, 7.5, 2, 1.0):
            saved = cost.open(u) - exposed(cost.pieces.at(u), cost.share)[cost.side]
            walked = cost.intercept + cost.slope * u - (1.0 - 0.0) * saved  # none unpaired
            assert cost(u) == walked and cost(u) == walked  # asked again: the same float
    assert hidden == twin and hash(hidden.blocks[0].forward_s) == hash(twin.blocks[0].forward_s)
    old = hidden.blocks[0].forward_s
    moved = replace(old, intercept=old.intercept + 1.0)
    assert moved(1.0) == pytest.approx(old(1.0) + 1.0)  # its own memo, not the old values


def test_the_targets_that_hide_the_all_to_all() -> None:
    assert hiding_choices(Choices(target="autopipe"), 4) == Choices(target="autopipe", schedule="dualpipe-v")
    megatron = hiding_choices(Choices(target="megatron"), 4)
    assert megatron == Choices(target="megatron", schedule="interleaved-1f1b", recompute=Recompute.NEVER)
    assert hiding_choices(Choices(target="megatron"), 1) is None  # Megatron's overlap needs p > 1
    assert hiding_choices(Choices(target="megatron", recompute=Recompute.ALWAYS), 4) is None  # nor full recompute
    assert hiding_choices(Choices(target="megatron", recompute_layers=2), 4) is None  # the block method is full
    # selective recomputation stays (Megatron-Bridge's DeepSeek-V3 H100 recipe: mla_up_proj, mlp, the overlap on)
    selective = Choices(target="megatron", recompute_modules=("mla_up_proj", "mlp"))
    assert hiding_choices(selective, 4) == replace(selective, schedule="interleaved-1f1b")
    assert hiding_choices(Choices(target="autopipe", schedule="1f1b"), 4) is None
    assert hiding_choices(Choices(target="torch"), 4) is None


def _request(**pins: object) -> ParallelRequest:
    return ParallelRequest(CLUSTER, 8, 40 * GB, stages=1, sharding=Sharding.NONE, **pins)  # type: ignore[arg-type]


def test_the_search_takes_the_expert_degree_that_fits_and_reduces_least() -> None:
    # One stage on 8 devices, no sharding: 16 bytes per fp32 parameter, 4 blocks of 1e8 dense + 8e8 / ep:
    # ep 1 holds 57.6 GB (over 40), ep 2 32 GB, ep 4 19.2 GB (E = 4: no ep 8). Same times; ep 4
    # all-reduces the fewest parameters each step, so it is chosen.
    options = _options(experts=4)
    result = plan_parallel(_moe_profile(1), _request(), None, None, options)
    plan = result.plan
    assert (plan.expert_parallel, plan.expert_tensor_parallel, plan.data_parallel) == (4, 1, 8)
    assert plan.stages[0].static_bytes == pytest.approx(16 * 4 * (DENSE + EXPERT // 4))
    assert [r.reason for r in result.rejected] == [  # ep 1: 57.6e9 bytes
        "needs at least 53.7 GiB per device for weights, gradients and optimizer state (none over its replicas)"
    ]
    pinned = plan_parallel(_moe_profile(1), _request(expert_parallel=2), None, None, options).plan
    assert pinned.expert_parallel == 2 and pinned.step_time_s > plan.step_time_s
    with pytest.raises(PlanError, match=r"^--expert-parallel 3 does not divide the 4 experts; use a divisor of 4$"):
        plan_parallel(_moe_profile(1), _request(expert_parallel=3), None, None, options)
    with pytest.raises(PlanError, match=r"^--expert-parallel 2: the model has no routed experts"):
        plan_parallel(chain_profile(4), _request(expert_parallel=2), None, None, replace(options, experts=None))


def test_the_search_shards_expert_state_over_the_expert_data_parallel_group() -> None:
    # ZeRO-1 with ep 2 on 8 devices: the dense state over 8 devices, 9 bytes per parameter; the
    # experts' over 8 / 2 = 4, 10 bytes per parameter
    request = replace(_request(expert_parallel=2), sharding=Sharding.ZERO1)
    plan = plan_parallel(_moe_profile(1), request, None, None, _options(experts=4)).plan
    assert plan.sharding == Sharding.ZERO1 and plan.expert_parallel == 2
    assert plan.stages[0].static_bytes == pytest.approx(4 * 4 * (DENSE * 9 / 4 + EXPERT // 2 * 10 / 4))


MOE = str(ROOT / "models" / "moe.py")


def test_a_small_moe_planned_from_its_model_file_with_expert_parallelism() -> None:
    import autopipe

    plan = autopipe.plan_cluster(
        MOE, device="h100", gpus=8, batch_size=16, memory="80GB", stages=2, tensor_parallel=1, expert_parallel=4
    )
    assert (plan.expert_parallel, plan.devices, plan.data_parallel) == (4, 2, 4)
    assert "ep=4" in plan.parallel_note
    with pytest.raises(PlanError, match=r"^--expert-parallel 3 does not divide the 8 experts; use a divisor of 8$"):
        autopipe.plan_cluster(MOE, device="h100", gpus=8, batch_size=16, stages=2, expert_parallel=3)


def test_the_cli_pins_expert_and_context_parallelism(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autopipe.cli.main import main

    out = str(tmp_path / "p.json")
    base = ["plan", MOE, "--device", "h100", "--gpus", "8", "--batch-size", "16", "--stages", "2", "-o", out]
    assert main([*base, "--tensor-parallel", "1", "--expert-parallel", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["expert_parallel"], got["expert_tensor_parallel"], got["context_parallel"]) == (2, 1, 1)
    assert main([*base, "--tensor-parallel", "1", "--context-parallel", "2", "--json"]) == 0  # 64 tokens: 2 x 2 chunks
    got = json.loads(capsys.readouterr().out)
    assert (got["context_parallel"], got["pipeline_parallel"], got["data_parallel"]) == (2, 2, 2)
    for flags, said in [
        (["--expert-parallel", "3"], "--expert-parallel 3 does not divide the 8 experts; use a divisor of 8"),
        (["--expert-parallel", "0"], "--expert-parallel"),
        (["--context-parallel", "3"], "--stages 2 x --context-parallel 3 = 6 does not divide --gpus 8"),
    ]:
        assert main([*base, *flags]) == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], (flags, err)
    gpt = ["plan", str(ROOT / "models" / "gpt.py"), "--device", "h100", "--batch-size", "8", "-o", out]
    assert main([*gpt, "--expert-parallel", "2"]) == 2
    assert "--expert-parallel applies to the devices of --gpus G" in capsys.readouterr().err


def test_a_larger_ep_no_slower_at_any_size_dominates() -> None:
    two, four = _moe_profile(2), _moe_profile(4)
    slower = replace(four, blocks=tuple(replace(b, forward_s=Affine(1e-4, 1e-3)) for b in four.blocks))
    steeper = replace(four, blocks=tuple(replace(b, forward_s=Affine(-1e-4, 1.05e-3)) for b in four.blocks))
    assert dominated([(Layout(ep=2), two), (Layout(ep=4), four)], [1.0, 8.0]) == {0}  # same times, less state
    assert dominated([(Layout(ep=2), two), (Layout(ep=4), slower)], [1.0, 8.0]) == set()
    assert dominated([(Layout(ep=2), two), (Layout(ep=4), steeper)], [1.0]) == {0}  # faster at 1 sample
    assert dominated([(Layout(ep=2), two), (Layout(ep=4), steeper)], [1.0, 8.0]) == set()  # slower at 8
    assert dominated([(Layout(ep=2), two), (Layout(ep=4, etp=2), four)], [1.0]) == set()  # another etp


def test_a_layout_that_fits_by_the_experts_count_is_planned_without_recomputation() -> None:
    # The tiny MoE (h 128, expert width f 64, top-2) on 8 devices, 2 stages, ep 4, m pinned: what it
    # needs with every activation kept is the limit, plus half of what the unfused experts' count
    # kept more for one micro-batch of one MoE layer on a device: (h + f - 1) bf16 elements per
    # routed pair (the expert outputs and SiLU's output, less the probability Megatron-Core's fused
    # weighted SwiGLU keeps). Every stage holds a MoE layer, so under that count no stage fitted
    # without recomputation; under Megatron-Core's it fits, and the search recomputes nothing.
    import autopipe

    h, f, k, seq = 128, 64, 2, 256
    common: dict[str, Any] = {
        "device": "h100",
        "gpus": 8,
        "batch_size": 16,
        "kwargs": {"block_size": seq},
        "stages": 2,
        "tensor_parallel": 1,
        "expert_parallel": 4,
    }
    kept = autopipe.plan_cluster(
        MOE, memory="80GB", choices=Choices(micro_batches=2, recompute=Recompute.NEVER), **common
    )
    u = 16 // (kept.data_parallel * kept.micro_batches)  # samples per micro-batch
    unfused = u * seq * k * (h + f - 1) * 2
    limit = max(kept.peak_memory_bytes) + unfused / 2
    plan = autopipe.plan_cluster(MOE, memory=limit, choices=Choices(micro_batches=2), **common)
    assert (plan.expert_parallel, plan.micro_batches) == (4, 2)
    assert not any(s.recompute for s in plan.stages) and not plan.memory_choice
    assert max(plan.peak_memory_bytes) <= limit < max(kept.peak_memory_bytes) + unfused
