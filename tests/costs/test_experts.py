"""Mixture-of-experts costs (costs/experts.py, the expert marks of costs/counting.py): a small
MoE counted on the meta device, its expert FLOPs, bytes, saved activations per device and
all-to-all volume against the hand-computed values; the same for Hugging Face's Mixtral,
Qwen3-MoE and DeepSeek-V3."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch

from autopipe.costs.analytic import ModelCounts, block_time, count_model, profile_from_counts
from autopipe.costs.counting import OpCount, grouped_mm_flops
from autopipe.costs.degrees import Degrees, device_ops
from autopipe.costs.devices import device_spec
from autopipe.costs.experts import (
    ExpertSplit,
    MoEShape,
    alltoall_bytes,
    alltoall_parts,
    alltoall_s,
    expert_data_parallel,
    expert_degrees,
    expert_ops,
    expert_reason,
)
from autopipe.costs.measure.timing import saved_bytes, storage_key
from autopipe.costs.options import Layout, Links, expert_gradient_group, layout_reason, parallel_options
from autopipe.costs.profile import ExpertTimes, Profile
from autopipe.errors import ProfileError
from autopipe.model.load import load_model
from tests.helpers import ROOT

MOE = str(ROOT / "models" / "moe.py")
ZOO = str(ROOT / "tests" / "fixtures" / "hf_zoo.py")
H, F, E, K, T = 128, 64, 8, 2, 64  # the tiny model: width, expert width, experts, top-k, tokens per sample
NV, NET = 450e9, 50e9


@pytest.fixture(scope="module")
def tiny() -> ModelCounts:
    torch.set_num_threads(1)
    return count_model(load_model(MOE, {}, device="meta"), micro_batch_sizes=(2, 4), dtype="bf16")


def _expert(ops: tuple[OpCount, ...]) -> list[OpCount]:
    return [op for op in ops if op.expert]


def test_the_counted_expert_work_is_the_top_k_experts(tiny: ModelCounts) -> None:
    names = [b.name for b in tiny.traces[0].blocks]
    for u, counts in zip((2, 4), tiny.counts, strict=True):
        n = u * T  # tokens of the micro-batch
        moe_layer, dense_layer = counts[names.index("layers.1")], counts[names.index("layers.0")]
        assert sum(op.flops for op in _expert(moe_layer.forward)) == 6 * n * K * H * F  # 3 GEMMs of h x f per pair
        assert sum(op.flops for op in _expert(moe_layer.backward)) == 12 * n * K * H * F
        assert sum(op.flops for op in _expert(moe_layer.backward_input)) == 6 * n * K * H * F
        assert _expert(dense_layer.forward) == [] and _expert(dense_layer.backward) == []
        cap = n * K // E  # pairs per expert at capacity factor 1
        (up, down) = [op for op in _expert(moe_layer.forward) if op.flops]
        assert (up.kind, up.dims, down.dims) == ("bmm", (cap, H, 2 * F), (cap, F, H))
        # a GEMM's bytes: both operands and the result, E groups, bf16
        assert up.bytes == E * (cap * H + H * 2 * F + cap * 2 * F) * 2
        assert down.bytes == E * (cap * F + F * H + cap * H) * 2


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "f"), [("mixtral", 32), ("qwen3_moe", 16), ("deepseek_v3", 16)])
def test_hugging_face_moe_counts_the_top_k_experts(arch: str, f: int) -> None:
    counts = count_model(load_model(ZOO, {"arch": arch}, device="meta"), micro_batch_sizes=(2, 4), dtype="bf16")
    for u, blocks in zip((2, 4), counts.counts, strict=True):
        n, h, k = u * 8, 32, 2  # hf_zoo: 8 tokens, width 32, top-2 of 8 experts
        moe_blocks = [c for c in blocks if _expert(c.forward)]
        assert len(moe_blocks) == 2  # DeepSeek's 3 layers: the first one dense
        for c in moe_blocks:
            assert sum(op.flops for op in _expert(c.forward)) == 6 * n * k * h * f  # not all 8 experts': 4x less
            assert sum(op.flops for op in _expert(c.backward)) == 12 * n * k * h * f
            assert {op.kind for op in _expert(c.forward) if op.flops} == {"grouped"}


def test_grouped_gemm_formulas() -> None:
    assert grouped_mm_flops((96, 32), (8, 32, 16)) == 2 * 96 * 32 * 16  # 96 rows, each by its group's 32 x 16
    assert grouped_mm_flops((32, 96), (96, 16)) == 2 * 32 * 96 * 16  # weight gradient into (8, 32, 16)
    assert grouped_mm_flops((8, 12, 32), (32, 96)) == 2 * 12 * 32 * 96
    assert grouped_mm_flops((8, 12, 32), (8, 32, 16)) == 2 * 8 * 12 * 32 * 16


SHAPE = MoEShape(256, 8, 7168, 4096, (0, 3 * 256 * 7168 * 2048), (0, 1), ((2048, 7168), (4096, 7168)))


def test_expert_gemms_per_device_by_hand() -> None:
    split = ExpertSplit(SHAPE, 16, NV, NET, ranks_per_node=8, tensor=2, imbalance=1.5)
    groups, rows, elt = 256, 128.0, 2.0  # the counted GEMM: 256 experts of 128 rows, (7168 x 4096) weights
    flops = 2 * groups * rows * 7168 * 4096
    nbytes = groups * (rows * 7168 + 7168 * 4096 + rows * 4096) * elt
    (op,) = expert_ops([OpCount(flops, nbytes, "bmm", (rows, 7168, 4096), True)], split, share=0.25)
    mine = rows * 16 * 2 * 1.5 * 0.25  # every local expert serves the group's pairs, x etp, x imbalance, / (t cp)
    assert op.dims == (mine, 7168, 2048)  # the FFN side split by etp
    assert op.flops == pytest.approx(flops * 1.5 * 0.25)
    assert op.bytes == pytest.approx(256 / 16 * (mine * 7168 + 7168 * 2048 + mine * 2048) * elt)
    (grad,) = expert_ops([OpCount(flops, nbytes, "bmm", (7168, rows, 4096), True)], split, share=0.25)
    assert grad.dims == (7168, mine, 2048)  # the weight gradient: the rows are the middle dimension
    (other,) = expert_ops([OpCount(0.0, 1000.0, "", (), True)], split, share=0.25)
    assert other.bytes == pytest.approx(1000.0 * 1.5 * 0.25)


def test_all_to_all_volume_by_hand() -> None:
    tokens, h, k = 4096, 7168, 8
    split = ExpertSplit(SHAPE, 64, NV, NET, ranks_per_node=8)
    pairs = tokens * k * h * 2.0  # bytes of the device's dispatched pairs, bf16
    intra, net = alltoall_bytes(split, tokens, 2.0)
    assert intra == pytest.approx(pairs * 7 / 64) and net == pytest.approx(pairs * 56 / 64)
    once = max(intra / NV, net / NET) + 2 * 10e-6
    assert alltoall_s(split, tokens, 2.0) == pytest.approx((2 * once, 2 * once))  # dispatch + combine, twice
    assert alltoall_parts(split, tokens, 2.0) == pytest.approx((once, once))
    fp8 = ExpertSplit(SHAPE, 64, NV, NET, ranks_per_node=8, dispatch_bytes=1.0)
    assert alltoall_s(fp8, tokens, 2.0)[0] == pytest.approx(max(intra / 2 / NV, net / 2 / NET) + 2e-5 + once)
    # the FP8 dispatch alone is smaller; its gradient, and the combine's both ways, move bf16
    assert alltoall_parts(fp8, tokens, 2.0) == pytest.approx((max(intra / 2 / NV, net / 2 / NET) + 2e-5, once))
    assert alltoall_s(fp8, tokens, 2.0)[1] == pytest.approx(2 * once)
    # DeepEP: a token crosses to each of the other 7 nodes at most once: 7 (1 - (7/8)^8) of them on average
    dedup = ExpertSplit(SHAPE, 64, NV, NET, ranks_per_node=8, deduplicate=True)
    crossings = 7 * (1 - (7 / 8) ** 8)
    d_intra, d_net = alltoall_bytes(dedup, tokens, 2.0)
    assert d_net == pytest.approx(tokens * h * 2.0 * crossings) and d_intra + d_net == pytest.approx(intra + net)
    limited = ExpertSplit(SHAPE, 64, NV, NET, ranks_per_node=8, deduplicate=True, max_nodes=4)
    assert alltoall_bytes(limited, tokens, 2.0)[1] == pytest.approx(tokens * h * 2.0 * 4)
    inside = ExpertSplit(SHAPE, 8, NV, NET, ranks_per_node=8)
    assert alltoall_bytes(inside, tokens, 2.0) == pytest.approx((pairs * 7 / 8, 0.0))  # one node: NVLink only
    assert alltoall_s(ExpertSplit(SHAPE, 1, NV, NET), tokens, 2.0) == (0.0, 0.0)


def test_degrees_and_groups() -> None:
    assert expert_reason(SHAPE, 64, 1, 128) == "" and expert_reason(SHAPE, 1, 1, 1) == ""
    assert expert_reason(SHAPE, 3, 1, 96) == "3 does not divide the 256 experts"
    assert "does not divide 16 devices per stage" in expert_reason(SHAPE, 32, 1, 16)
    assert "no routed experts" in expert_reason(None, 2, 1, 16)
    ok, skipped = expert_degrees(SHAPE, 48)
    assert ok == [1, 2, 4, 8, 16] and [e for e, _ in skipped] == [3, 6, 12, 24, 48]
    assert expert_degrees(SHAPE, 16, etp=2)[0] == [1, 2, 4, 8]
    assert expert_data_parallel(2, 1, 16, 32) == 1 and expert_data_parallel(1, 2, 64, 8, 2) == 8
    assert expert_gradient_group(Layout(t=2, ep=32), 16) == 1  # Megatron-Bridge's Qwen3 row: t2 x EP32, d16


def test_a_small_moe_priced_under_expert_parallelism(tiny: ModelCounts) -> None:
    spec = device_spec("h100")
    links = Links(8, NV, NET)
    options = parallel_options(tiny, spec, links, imbalance=1.0)
    assert options.experts is not None and options.experts.moe_layers == (0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 0)
    whole = profile_from_counts(tiny, spec)
    one = options.price(Layout())
    for a, b in zip(one.blocks, whole.blocks, strict=True):  # ep = 1: today's profile (summed in another order)
        times = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
        assert replace(a, expert_params=0, experts_s=ExpertTimes(), **{f: getattr(b, f) for f in times}) == b
        assert all(getattr(a, f)(2) == pytest.approx(getattr(b, f)(2), rel=1e-9) for f in times)
    assert [b.expert_params for b in one.blocks] == [E * 3 * H * F if n else 0 for n in options.experts.moe_layers]
    names = [b.name for b in whole.blocks]
    i = names.index("layers.1")
    experts = E * (H * 2 * F + F * H)  # the layer's grouped weights
    for ep in (2, 4, 8):
        prof = options.price(Layout(ep=ep))
        block = prof.blocks[i]
        assert block.expert_params == experts // ep and block.params == whole.blocks[i].params - experts + experts // ep
        assert block.forward_flops(2) == pytest.approx(whole.blocks[i].forward_flops(2))  # balanced: the same work
        d = Degrees(experts=ExpertSplit(options.experts, ep, NV, NET, ranks_per_node=ep, imbalance=1.0))
        for u, counts in zip((2, 4), tiny.counts, strict=True):
            a2a = alltoall_s(d.experts, u * T, 2.0)  # type: ignore[arg-type]
            parts = options.alltoall(Layout(ep=ep), u)  # (dispatch, combine)
            assert a2a[0] > 0 and parts == pytest.approx(alltoall_parts(d.experts, u * T, 2.0))  # type: ignore[arg-type]
            assert sum(parts) == pytest.approx(a2a[0])
            ops = device_ops(counts[i].forward, "whole", d)
            want = block_time(ops, spec, "bf16") + a2a[0]
            assert block.forward_s(u) == pytest.approx(want)
            # the routed experts' compute: the marked ops' time, inside the block's
            routed = block_time([op for op in ops if op.expert], spec, "bf16")
            assert 0 < block.experts_s.forward(u) == pytest.approx(routed) and routed < want - a2a[0]
            grads = device_ops(counts[i].backward_input, "whole", d)
            assert block.experts_s.backward_input(u) == pytest.approx(
                block_time([op for op in grads if op.expert], spec, "bf16")
            )
            assert block.experts_s.backward_input(u) < block.experts_s.backward(u) < block.backward_s(u)
        assert not prof.blocks[names.index("layers.0")].experts_s  # a dense layer: none
    skewed = parallel_options(tiny, spec, links, imbalance=1.5).price(Layout(ep=2))
    added = skewed.blocks[i].forward_flops(2) - options.price(Layout(ep=2)).blocks[i].forward_flops(2)
    assert added == pytest.approx(0.5 * 6 * 2 * T * K * H * F)  # the busiest device: 1.5 x the pairs
    assert "ep=2 (imbalance 1.5)" in skewed.device


def test_the_experts_keep_what_megatron_cores_grouped_experts_keep() -> None:
    # Per routed (token, expert) pair, as Megatron-Core's alltoall dispatcher and grouped experts
    # hold it: the expert's input (h, the first grouped GEMM's), the fused weighted SwiGLU's input
    # (2f) and the pair's probability (1), the second GEMM's input (f), in bf16; the dispatch, the
    # probabilities' gather and the combine keep one int64 index per pair each (the first with one
    # more slot: the dropped pairs' zero row). Not the expert outputs (h) or SiLU's output (f)
    # the unfused form keeps: 2 h + 4 f per pair.
    model = load_model(MOE, {}, device="meta").model
    moe = sys.modules[type(model).__module__]  # the model file, as loaded
    cfg = moe.make_config()
    with torch.device("meta"):
        experts = moe.Experts(cfg).to(torch.bfloat16)
    weights = {storage_key(p) for p in experts.parameters()}
    for n in (64, 128):  # tokens
        x = torch.empty(n, H, device="meta", dtype=torch.bfloat16, requires_grad=True)
        probs = torch.empty(n, K, device="meta", dtype=torch.bfloat16, requires_grad=True)
        chosen = torch.zeros(n, K, device="meta", dtype=torch.int64)
        pairs = n * K
        got = saved_bytes(lambda x=x, probs=probs, chosen=chosen: experts(x, probs, chosen), exclude=weights)
        assert got == pairs * (H + 2 * F + 1 + F) * 2 + (3 * pairs + 1) * 8


def test_saved_activations_per_device_under_expert_parallelism(tiny: ModelCounts) -> None:
    # A device keeps its own tokens' activations whatever ep: its T / (t cp) tokens send k pairs
    # each, and on average (balanced routing) as many pairs land on its E / ep experts, so the
    # MoE layer's saved bytes per device are the same at ep 1, 2, 4, 8 (each expert's pairs are
    # not on every device: that would be ep times more); sequence parallelism (t) and context
    # parallelism (cp) divide them, each device holding 1 / t (1 / cp) of the sequence.
    options = parallel_options(tiny, device_spec("h100"), Links(8, NV, NET), imbalance=1.0)
    names = [b.name for b in tiny.traces[0].blocks]
    i = names.index("layers.1")
    whole = options.price(Layout()).blocks[i].saved_bytes
    for u, counts in zip((2, 4), tiny.counts, strict=True):
        assert whole(u) == pytest.approx(counts[i].saved_bytes)
        for ep in (2, 4, 8):
            assert options.price(Layout(ep=ep)).blocks[i].saved_bytes(u) == pytest.approx(whole(u))
        assert options.price(Layout(t=2, ep=4)).blocks[i].saved_bytes(u) == pytest.approx(whole(u) / 2)
        assert options.price(Layout(t=2, cp=2, ep=4)).blocks[i].saved_bytes(u) == pytest.approx(whole(u) / 4)


def test_layout_rules(tiny: ModelCounts) -> None:
    options = parallel_options(tiny, device_spec("h100"), Links(8, NV, NET))
    assert layout_reason(options, Layout(t=2, cp=2, ep=4), 16, 2) == ""
    assert layout_reason(options, Layout(ep=3), 12) == "3 does not divide the 8 experts"
    assert "2 x 64" in layout_reason(options, Layout(cp=64), 64)  # 64 tokens do not make 128 chunks
    assert "does not divide 12 devices" in layout_reason(options, Layout(t=2, cp=2, ep=2), 12, 2)
    with pytest.raises(ValueError, match="imbalance must be a number >= 1"):
        parallel_options(tiny, device_spec("h100"), imbalance=0.5)
    with pytest.raises(ValueError, match=r"alltoall_share must be in \[0, 1\) \(got 1.5\); 0 where not known"):
        parallel_options(tiny, device_spec("h100"), alltoall_share=1.5)
    assert parallel_options(tiny, device_spec("h100"), alltoall_share=20 / 132).alltoall_share == 20 / 132


def test_expert_params_in_the_profile_file(tiny: ModelCounts) -> None:
    prof = parallel_options(tiny, device_spec("h100")).price(Layout(ep=4))
    assert Profile.from_json(prof.to_json()) == prof
    plain = profile_from_counts(tiny, device_spec("h100"))
    assert '"expert_params"' not in plain.to_json()  # left out at 0: files are written as before
    assert '"experts_s"' in prof.to_json() and '"experts_s"' not in plain.to_json()
    assert any(b.experts_s for b in prof.blocks) and prof.slowed(2.0).blocks[2].experts_s.forward(1) == pytest.approx(
        2 * prof.blocks[2].experts_s.forward(1)
    )
    bad = prof.to_json().replace('"expert_params": 49152', '"expert_params": 10000000')
    with pytest.raises(ProfileError, match=r"has expert_params 10000000, expected 0 to its \d+ params"):
        Profile.from_json(bad, "p.json")
