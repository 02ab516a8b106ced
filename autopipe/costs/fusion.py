"""Fused kernels: a run of memory-bound ops priced as the one kernel a fusing framework runs.

Counted op by op (``costs.counting``), a transformer layer's element-wise work -- norms,
activations, rotary embedding, residual adds, dropout, the loss's softmax -- is a dozen or more
aten kernels between two GEMMs, each reading its inputs from device memory and writing its
output back: eager PyTorch's traffic. Frameworks built for training fuse them. Megatron-LM with
Transformer Engine runs, between its GEMMs, a fused layer norm / RMSNorm (TE's ``LayerNormLinear``,
Apex ``FusedLayerNorm``), fused bias-GeLU and bias-SwiGLU (``megatron/core/fusions/fused_bias_gelu.py``,
``fused_bias_swiglu.py``), fused bias-dropout-add (``fused_bias_dropout.py``), fused rotary
embedding (``apply_rope_fusion``), the fused scale-mask-softmax (``fused_softmax.py``, where attention
is not flash) and the fused vocabulary-parallel cross entropy (``fused_cross_entropy.py``). Each
reads what it needs once and writes what later kernels need; what it saves for its own backward
is its inputs (already in memory) and small statistics, the rest recomputed in that backward.

So :func:`fuse` prices a block's op sequence as such a framework runs it: every maximal run of
memory-bound ops (no FLOPs counted, not a GEMM or attention kernel; views inside it move
nothing) is one kernel that moves::

    bytes = sum of the storages it reads that no op of the run wrote before
          + sum of the storages it writes that an op after the run reads, or that leave the block
            (its outputs, the gradients its backward hands back: ``BlockCount.escapes``)

each storage once (``OpCount.reads`` / ``writes``), at one op overhead. The copies that put a
weight's gradient into its ``.grad`` (memory-bound ops writing only parameters' gradients) move
nothing: Megatron-LM's weight-gradient GEMM accumulates into the gradient buffer itself
(``--gradient-accumulation-fusion``, on by default; TE's ``fuse_wgrad_accumulation``). A run next to a batched
matmul or an attention kernel is part of attention's core (the scores' scale, mask, softmax and
dropout; the heads' reshapes): it works on the device's own heads, so tensor parallelism splits
it whole (``kind`` ``"heads"``; ``costs.tensor.split_ops``). Eager autograd's saved
intermediates (an RMSNorm's fp32 copy of its input, say) are not written: the fused kernel's
backward recomputes them from the run's inputs, which its backward run reads. This is the ideal
of one kernel per run; Megatron splits some runs in two (bias-dropout-add, then the next layer
norm), one more pass over a ``(s, b, h)`` tensor. GEMMs and attention keep their counted bytes.

Tests: tests/costs/test_fusion.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from autopipe.costs.counting import OpCount

__all__ = ["HEADS", "fuse", "memory_bound"]

HEADS = ("bmm", "attention")  # the kernels of attention's core: a fused run beside one works per head


def memory_bound(op: OpCount) -> bool:
    """Whether ``op`` is one a fusing framework folds into its neighbours' kernel: no FLOPs counted
    and no GEMM or attention kernel (element-wise ops, reductions, copies; views)."""
    return op.flops == 0 and not op.kind


def fuse(
    ops: Sequence[OpCount], escapes: frozenset[int] = frozenset(), grads: frozenset[int] = frozenset()
) -> tuple[OpCount, ...]:
    """``ops`` with every maximal run of memory-bound ops as one op of the bytes its fused kernel
    moves (module docstring); ``escapes``: the storages that leave the block, ``grads`` those of
    them that are parameters' gradients. Ops counted without their storages (``reads`` and
    ``writes`` empty, made by pricing) keep their bytes."""
    ops = [op for op in ops if not _accumulates(op, grads)]
    last_read: dict[int, int] = {}
    for i, op in enumerate(ops):
        for key, _ in op.reads:
            last_read[key] = i
    out: list[OpCount] = []
    i = 0
    while i < len(ops):
        if not memory_bound(ops[i]):
            out.append(ops[i])
            i += 1
            continue
        end = i
        while end < len(ops) and memory_bound(ops[end]):
            end += 1
        kernel = _kernel(ops[i:end], end, last_read, escapes)
        near = [ops[j].kind for j in (i - 1, end) if 0 <= j < len(ops)]
        out.append(replace(kernel, kind="heads") if any(k in HEADS for k in near) else kernel)
        i = end
    return tuple(out)


def _accumulates(op: OpCount, grads: frozenset[int]) -> bool:
    """Whether ``op`` only puts a weight gradient in its buffer (autograd's copy into ``.grad``):
    a fusing framework's weight-gradient GEMM accumulates into that buffer itself."""
    return memory_bound(op) and bool(op.writes) and all(k in grads for k, _ in op.writes)


def _kernel(run: Sequence[OpCount], end: int, last_read: dict[int, int], escapes: frozenset[int]) -> OpCount:
    """One kernel for ``run`` (the ops before index ``end`` of their sequence)."""
    written: dict[int, float] = {}
    read: dict[int, float] = {}
    loose = 0.0  # bytes of ops counted without their storages
    for op in run:
        if not op.reads and not op.writes:
            loose += op.bytes
            continue
        for key, nbytes in op.reads:
            if key not in written:
                read[key] = max(read.get(key, 0.0), nbytes)
        for key, nbytes in op.writes:
            written[key] = max(written.get(key, 0.0), nbytes)
    out = sum(b for k, b in written.items() if k in escapes or last_read.get(k, -1) >= end)
    if not read and not written:
        return OpCount(0.0, loose)
    return OpCount(0.0, sum(read.values()) + out + loose)
