"""costs/fusion.py: a run of memory-bound ops priced as one fused kernel (hand-computed bytes), and
the unfused attention of costs/counting.py that the pre-FlashAttention rows are counted with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autopipe.costs.analytic import count_model
from autopipe.costs.counting import OpCount, count_block, numbered
from autopipe.costs.fusion import fuse, memory_bound
from autopipe.costs.tensor import split_ops
from autopipe.errors import ProfileError
from autopipe.model.load import load_model


def _op(reads: dict[int, float], writes: dict[int, float], flops: float = 0.0, kind: str = "") -> OpCount:
    moved = sum(reads.values()) + sum(writes.values())
    return OpCount(flops, moved, kind, (), False, tuple(reads.items()), tuple(writes.items()))


def test_a_run_reads_its_inputs_once_and_writes_what_later_ops_read() -> None:
    # a (100 B) -> b -> c, and c with a again -> d, which the GEMM reads: the kernel reads a, writes d
    ops = [
        _op({1: 100.0}, {2: 100.0}),
        _op({2: 100.0}, {3: 100.0}),
        _op({3: 100.0, 1: 100.0}, {4: 100.0}),
        _op({4: 100.0, 9: 50.0}, {5: 100.0}, flops=1e6, kind="linear"),
    ]
    fused = fuse(ops)
    assert [op.bytes for op in fused] == [200.0, 250.0]  # 100 read + 100 written; the GEMM as counted
    assert fused[1] == ops[3]
    assert fused[0].flops == 0 and fused[0].kind == ""


def test_what_leaves_the_block_is_written_and_weight_gradient_copies_move_nothing() -> None:
    ops = [
        _op({1: 100.0}, {2: 100.0}),  # 2 is an output of the block
        _op({2: 100.0}, {3: 40.0}),  # 3: a statistic nobody reads (eager autograd's saved copy): not written
        _op({1: 100.0, 7: 8.0}, {8: 8.0}),  # 8: a weight's gradient put into .grad: dropped
    ]
    assert [op.bytes for op in fuse(ops, escapes=frozenset({2, 8}), grads=frozenset({8}))] == [200.0]
    assert [op.bytes for op in fuse(ops, escapes=frozenset({2, 8}))] == [216.0]  # 100 + 8 read, 100 + 8 written


def test_a_run_beside_attention_is_split_by_heads() -> None:
    ops = [_op({1: 10.0}, {2: 10.0}, 5.0, "bmm"), _op({2: 10.0}, {3: 10.0}), _op({3: 10.0}, {4: 10.0}, 5.0, "bmm")]
    fused = fuse(ops)
    assert fused[1].kind == "heads" and fused[1].bytes == 20.0
    assert not memory_bound(fused[1])
    assert split_ops(fused, "layer", 4, False)[1].bytes == 5.0  # all of it /t, not Korthikanti's replicated share
    assert split_ops([OpCount(0.0, 34.0)], "layer", 4, False)[0].bytes == 10.0 + 24.0 / 4  # an eager op: sbh(10 + 24/t)


class _Pointwise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x) * 2.0 + x


def test_a_counted_chain_of_pointwise_ops_fuses_to_one_read_and_one_write() -> None:
    x = torch.empty(4, 256, device="meta")  # fp32: 4096 bytes
    count, _ = count_block(_Pointwise(), [x])
    assert len([op for op in count.forward if op.bytes]) == 3  # gelu, mul, add: eager, one kernel each
    assert sum(op.bytes for op in count.forward) == 3 * 2 * 4096 + 4096  # add reads two tensors
    fused = fuse(count.forward, count.escapes, count.grads)
    assert [op.bytes for op in fused] == [2 * 4096]  # read x, write the output
    backward = fuse(count.backward, count.escapes, count.grads)
    assert len(backward) == 1 and backward[0].bytes <= 3 * 4096  # read the gradient and x, write x's gradient


class _Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_unfused_attention_materialises_the_scores_in_the_input_dtype() -> None:
    b, h, t, d = 2, 4, 64, 16
    qkv = [torch.empty(b, h, t, d, device="meta", dtype=torch.bfloat16) for _ in range(3)]
    flash, _ = count_block(_Attention(), qkv)
    assert [op.kind for op in flash.forward if op.flops] == ["attention"]
    count, _ = count_block(_Attention(), qkv, flash=False)
    gemms = [op for op in count.forward if op.flops]
    assert [op.kind for op in gemms] == ["bmm", "bmm"]
    assert sum(op.flops for op in gemms) == 2 * 2 * b * h * t * t * d  # every score, the masked half too
    scores = b * h * t * t * 2  # bf16, as Megatron-LM's CoreAttention kept them
    kernels = fuse(count.forward, count.escapes, count.grads)
    between = kernels[next(i for i, op in enumerate(kernels) if op.kind == "bmm") + 1]
    assert between.kind == "heads" and between.bytes == 2 * scores  # read the scores, write the probabilities
    # kept for backward: q, k, v, the probabilities and the causal mask (one byte a score of one head)
    assert count.saved_bytes == 3 * b * h * t * d * 2 + scores + t * t


def test_numbering_is_the_order_of_first_use() -> None:
    x = torch.empty(4, 256, device="meta")
    one, _ = count_block(_Pointwise(), [x])
    two, _ = count_block(_Pointwise(), [torch.empty(4, 256, device="meta")])
    assert one == two  # other storages, other addresses: the same numbers
    assert numbered(one, 10).forward[0].reads[0][0] == 10


def test_an_unknown_attention_is_one_line() -> None:
    loaded = load_model(str(Path(__file__).resolve().parents[2] / "models" / "gpt.py"), {}, device="meta")
    with pytest.raises(ProfileError, match=r"^unknown attention 'sdpa'; use one of: flash, unfused$"):
        count_model(loaded, attention="sdpa")
