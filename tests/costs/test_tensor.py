"""Tensor parallelism in the analytic cost model (costs/tensor.py): formulas by hand, and a
2-layer GPT priced at t = 1, 2, 4 from one count."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from autopipe.costs.analytic import ModelCounts, count_model, profile_from_counts
from autopipe.costs.counting import OpCount, block_time
from autopipe.costs.devices import device_spec
from autopipe.costs.tensor import (
    REPLICATED_SHARE,
    TensorSplit,
    TransformerShape,
    comm_s,
    exposed,
    shape_of,
    split_ops,
    split_params,
    split_saved,
    tensor_degrees,
    tensor_reason,
    transformer_shape,
)
from autopipe.model.load import load_model
from tests.helpers import ROOT

GPT = str(ROOT / "models" / "gpt.py")
SHAPE = TransformerShape(
    hidden=128,
    heads=4,
    kv_heads=4,
    seq=64,
    vocab=512,
    layers=("blocks.0", "blocks.1"),
    embedding=("wte",),
    head=("lm_head",),
)
NV, LAT = 450e9, 10e-6


@pytest.fixture(scope="module")
def counts() -> ModelCounts:
    torch.set_num_threads(1)
    loaded = load_model(GPT, {"n_layer": 2}, device="meta")  # 4 heads, width 128, 64 tokens, vocab 512
    return count_model(loaded, micro_batch_sizes=(1, 2), dtype="bf16")


def test_ops_split_as_megatron_does() -> None:
    ops = (OpCount(800.0, 80.0), OpCount(0.0, 340.0))  # a matmul and an element-wise op
    assert split_ops(ops, "layer", 4, sequence_parallel=True) == (OpCount(200.0, 20.0), OpCount(0.0, 85.0))
    # without sequence parallelism 10 of Korthikanti's 34 sbh stay whole: 340 * (10/34 + 24/34/4) = 160
    assert split_ops(ops, "layer", 4, sequence_parallel=False)[1].bytes == pytest.approx(160.0)
    assert split_ops(ops, "embedding", 4, False) == (
        OpCount(200.0, 20.0),
        OpCount(0.0, 340.0),
    )  # the lookup stays whole
    assert split_ops(ops, "head", 4, False)[1] == OpCount(0.0, 85.0)  # logits and loss over vocabulary shards
    assert split_ops(ops, "whole", 4, True) == ops and split_ops(ops, "layer", 1, True) == ops
    assert REPLICATED_SHARE == pytest.approx(10 / 34)


def test_collectives_memory_and_params_by_hand() -> None:
    split = TensorSplit(SHAPE, 2, True, NV, LAT)
    nbytes = 3 * 64 * 128 * 2  # u = 3 samples of s x h bf16 values
    one = 2 * (2 - 1) / 2 * nbytes / NV + 2 * (2 - 1) * LAT  # ring all-reduce (= reduce-scatter + all-gather)
    assert comm_s("layer", 3, split, 2.0) == pytest.approx((2 * one, 2 * one))  # 2 forward, 2 backward
    assert comm_s("embedding", 3, split, 2.0) == pytest.approx((one, 0.0))
    assert comm_s("head", 3, split, 2.0) == pytest.approx((0.0, one))
    assert comm_s("whole", 3, split, 2.0) == (0.0, 0.0)
    assert split_saved(3400.0, "layer", 2, True) == pytest.approx(1700.0)  # 34 sbh / t
    assert split_saved(3400.0, "layer", 2, False) == pytest.approx(100.0 * (10 + 24 / 2))  # sbh (10 + 24 / t)
    assert split_saved(3400.0, "embedding", 2, True) == 3400.0
    assert split_params(198_272, "layer", 2, SHAPE) == 99_136
    assert split_params(65_536, "embedding", 4, SHAPE) == 16_384  # the (512, 128) table, vocabulary-parallel
    assert split_params(8_192, "embedding", 4, SHAPE) == 8_192  # smaller than the table: not it


def test_an_overlap_share_hides_collectives_up_to_the_computation() -> None:
    serial, half = TensorSplit(SHAPE, 2, True, NV, LAT), TensorSplit(SHAPE, 2, True, NV, LAT, overlap=0.5)
    assert exposed(10.0, 4.0, serial) == 14.0 and exposed(10.0, 4.0, None) == 14.0
    assert exposed(10.0, 4.0, half) == 12.0  # half of 4 s hidden
    assert exposed(1.0, 4.0, replace(half, overlap=1.0)) == 4.0  # at most the 1 s it computes


def test_the_overlap_share_lowers_each_blocks_time(counts: ModelCounts) -> None:
    spec = device_spec("h100")
    serial = profile_from_counts(counts, spec, TensorSplit(SHAPE, 2, True, NV, LAT))
    hidden = profile_from_counts(counts, spec, TensorSplit(SHAPE, 2, True, NV, LAT, overlap=1.0))
    layer = [b.name for b in serial.blocks].index("blocks.0")
    comm = 2 * (2 * 64 * 128 * 2 / NV + 2 * LAT)  # two all-reduces at t = 2, u = 2 (as above)
    compute = serial.blocks[layer].forward_s(2) - comm
    assert hidden.blocks[layer].forward_s(2) == pytest.approx(max(compute, comm), rel=1e-9)  # the longer of the two


def test_degrees_stay_in_a_node_and_divide_the_heads() -> None:
    assert tensor_degrees(SHAPE, 8, 64) == ([1, 2, 4], [(8, "8 does not divide the 4 attention heads")])
    assert tensor_degrees(replace(SHAPE, kv_heads=2), 8, 64)[0] == [1, 2]
    assert "stays within a node" in tensor_reason(SHAPE, 4, 2, 64)
    assert tensor_degrees(None, 8, 64) == ([1], [])


@pytest.mark.slow
def test_a_two_layer_gpt_priced_per_device(counts: ModelCounts) -> None:
    spec = device_spec("h100")
    shape = shape_of(counts.traces[0], counts.loaded.model)
    assert shape == SHAPE
    whole = profile_from_counts(counts, spec)
    for t in (2, 4):
        split = TensorSplit(shape, t, True, NV, LAT)
        prof = profile_from_counts(counts, spec, split)
        by = {b.name: b for b in prof.blocks}
        one = {b.name: b for b in whole.blocks}
        assert by["blocks.0"].params == 198_272 // t and by["wte"].params == 65_536 // t
        assert by["wpe"] == one["wpe"] and by["ln_f"] == one["ln_f"]  # replicated: unchanged
        assert (
            by["lm_head"].shared_param_bytes == one["lm_head"].shared_param_bytes // t
        )  # tied head, vocabulary-parallel
        i = [b.name for b in whole.blocks].index("blocks.0")
        for u, c in zip((1, 2), counts.counts, strict=True):
            fwd = (
                block_time(split_ops(c[i].forward, "layer", t, True), spec, "bf16") + comm_s("layer", u, split, 2.0)[0]
            )
            assert by["blocks.0"].forward_s(u) == pytest.approx(fwd)
            assert by["blocks.0"].saved_bytes(u) == pytest.approx(c[i].saved_bytes / t)
            assert by["blocks.0"].forward_flops(u) == pytest.approx(one["blocks.0"].forward_flops(u) / t)
    assert profile_from_counts(counts, spec, None) == whole  # t = 1 is the profile of today


def test_the_structure_comes_from_the_config_and_the_longest_module_list() -> None:
    from torch import nn

    class Config:  # Hugging Face names, grouped-query attention
        hidden_size, num_attention_heads, num_key_value_heads, vocab_size = 8, 4, 2, 16

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = Config()
            self.embed = nn.Embedding(16, 8)
            self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
            self.norms = nn.ModuleList([nn.LayerNorm(8)])
            self.head = nn.Linear(8, 16)

    names = ["embed", "layers.0", "layers.1", "head"]
    assert transformer_shape(Net(), names, (1, 5, 8)) == TransformerShape(
        8, 4, 2, 5, 16, ("layers.0", "layers.1"), ("embed",), ("head",)
    )
    assert transformer_shape(Net(), names, (1, 5, 9)) is None  # the layer input is not (1, s, h)
    assert transformer_shape(nn.Sequential(nn.Linear(8, 8)), ["0"], (1, 5, 8)) is None  # no config: t = 1 only
