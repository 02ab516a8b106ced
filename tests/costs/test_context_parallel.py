"""Context parallelism in the analytic cost model (costs/context.py): the causal split against
a brute-force count of attention rows, and a small Llama priced at cp = 2 and 4 from one count:
attention work and activations per device scale as the formulas say."""

from __future__ import annotations

import pytest
import torch

from autopipe.costs.analytic import ModelCounts, block_time, count_model, profile_from_counts
from autopipe.costs.context import (
    ContextShape,
    ContextSplit,
    attention_share,
    context_ops,
    context_reason,
    context_shape,
    kv_exchange_s,
)
from autopipe.costs.counting import OpCount
from autopipe.costs.degrees import Degrees
from autopipe.costs.devices import device_spec
from autopipe.model.load import load_model
from tests.helpers import ROOT

LLAMA = str(ROOT / "models" / "llama.py")
SEQ = 64  # the tiny Llama's tokens per sample


@pytest.fixture(scope="module")
def llama() -> ModelCounts:
    torch.set_num_threads(1)
    loaded = load_model(LLAMA, {"n_layer": 2}, device="meta")  # 4 heads (2 key/value) of 32, 64 tokens
    return count_model(loaded, micro_batch_sizes=(1, 2), dtype="bf16")


def causal_rows(s: int, cp: int, balanced: bool) -> list[int]:
    """Keys each device's queries attend to under a causal mask (query i sees keys 0..i)."""
    work = [0] * cp
    if balanced:  # Megatron: 2 cp chunks, device r holds chunks r and 2 cp - 1 - r
        c = s // (2 * cp)
        for r in range(cp):
            rows = [*range(r * c, (r + 1) * c), *range((2 * cp - 1 - r) * c, (2 * cp - r) * c)]
            work[r] = sum(i + 1 for i in rows)
    else:
        c = s // cp
        for r in range(cp):
            work[r] = sum(i + 1 for i in range(r * c, (r + 1) * c))
    return work


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8, 16])
def test_attention_share_is_the_busiest_devices(cp: int) -> None:
    s = 2 * cp * 512
    total = s * (s + 1) // 2
    balanced = causal_rows(s, cp, True)
    assert sum(balanced) == total and max(balanced) == min(balanced)  # every device the same
    assert max(balanced) / total == pytest.approx(attention_share(cp, True), rel=1e-12)
    contiguous = causal_rows(s, cp, False)
    assert max(contiguous) / total == pytest.approx(attention_share(cp, False), rel=2e-3)  # (2 cp - 1) / cp^2


def test_ops_per_device_by_hand() -> None:
    split = ContextSplit(ContextShape(256, 4096), 4, 450e9)
    att = OpCount(8000.0, 400.0, "attention")
    linear = OpCount(1200.0, 120.0, "linear", (4096.0, 512.0, 256.0))
    out = context_ops([att, linear, OpCount(0.0, 80.0)], split)
    assert out[:4] == (OpCount(8000.0 / 16, 100.0, "attention"),) * 4  # 4 ring steps of 1/4 of the device's 1/4
    assert out[4] == OpCount(300.0, 30.0, "linear", (1024.0, 512.0, 256.0))  # the tokens split
    assert out[5] == OpCount(0.0, 20.0)
    assert context_ops([att], ContextSplit(ContextShape(256, 4096), 1, 450e9)) == (att,)


def test_key_value_ring_by_hand() -> None:
    shape = ContextShape(kv_width=2 * 8 * 128, seq=8192)  # 8 key/value heads of 128
    split = ContextSplit(shape, 4, 100e9, 5e-6)
    chunk = 2 * 8192 / 4 * 2048 * 2.0  # u = 2 samples, s / cp tokens, bf16 keys and values
    step = chunk / 100e9 + 5e-6
    assert kv_exchange_s(split, 2, 2.0, (0.0, 0.0)) == pytest.approx((3 * step, 3 * 2 * step))
    assert kv_exchange_s(split, 2, 2.0, (4 * step / 2, 4 * step)) == pytest.approx((3 * step / 2, 3 * step))
    assert kv_exchange_s(split, 2, 2.0, (1.0, 1.0)) == (0.0, 0.0)  # hidden behind the attention
    assert kv_exchange_s(ContextSplit(shape, 1, 100e9), 2, 2.0, (0.0, 0.0)) == (0.0, 0.0)


def test_the_shape_from_the_config() -> None:
    class Gqa:
        hidden_size, num_attention_heads, num_key_value_heads, head_dim = 4096, 64, 4, 128

    class Mla:  # DeepSeek-V3's names
        hidden_size, num_attention_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim = 7168, 128, 128, 64, 128

    class Model:
        def __init__(self, config: object) -> None:
            self.config = config

    assert context_shape(Model(Gqa()), 4096) == ContextShape(2 * 4 * 128, 4096)
    assert context_shape(Model(Mla()), 4096) == ContextShape(128 * (128 + 64 + 128), 4096)
    assert context_shape(Model(object()), 4096) is None
    assert context_reason(ContextShape(1, 4096), 8) == ""
    assert (
        context_reason(ContextShape(1, 4096), 3) == "the sequence of 4096 tokens does not split into 2 x 3 equal chunks"
    )
    assert "context parallelism needs" in context_reason(None, 2)


@pytest.mark.parametrize("cp", [2, 4])
def test_a_small_llama_per_device(llama: ModelCounts, cp: int) -> None:
    spec = device_spec("h100")
    shape = context_shape(llama.loaded.model, SEQ)
    assert shape == ContextShape(2 * 2 * 32, SEQ)
    whole = profile_from_counts(llama, spec)
    slow = ContextSplit(shape, cp, 1e6, 10e-6)  # a link too slow to hide: every step's transfer is paid
    prof = profile_from_counts(llama, spec, Degrees(context=slow))
    names = [b.name for b in whole.blocks]
    i = names.index("layers.0")
    for u, counts in zip((1, 2), llama.counts, strict=True):
        c = counts[i]
        att = sum(op.flops for op in c.forward if op.kind == "attention")
        rest = sum(op.flops for op in c.forward if op.kind != "attention")
        assert att > 0 and prof.blocks[i].forward_flops(u) == pytest.approx(att / cp + rest / cp)
        for j in range(len(names)):  # activations: 1 / cp on every device, every block
            assert prof.blocks[j].saved_bytes(u) == pytest.approx(whole.blocks[j].saved_bytes(u) / cp)
        ops = context_ops(c.forward, slow)
        assert sum(op.kind == "attention" for op in ops) == cp * sum(op.kind == "attention" for op in c.forward)
        attention = block_time([op for op in ops if op.kind == "attention"], spec, "bf16")
        ring = kv_exchange_s(slow, u, 2.0, (attention, 0.0))[0]
        assert ring == pytest.approx((cp - 1) * (u * SEQ / cp * 128 * 2 / 1e6 + 10e-6 - attention / cp))
        assert prof.blocks[i].forward_s(u) == pytest.approx(block_time(ops, spec, "bf16") + ring)
    assert prof.blocks[i].params == whole.blocks[i].params  # parameters whole on every CP rank
    assert f"cp={cp}" in prof.device
