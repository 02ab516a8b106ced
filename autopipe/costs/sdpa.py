"""Attention on the meta device as the counted kernels run it: the fused (flash) kernel's path,
or the unfused scores of the pre-FlashAttention runs (``fused_attention``), for
:mod:`autopipe.costs.counting` and the activation anatomy.

Tests: tests/costs/test_counting.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["fused_attention"]

aten = torch.ops.aten
_CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu
_CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward
_EFFICIENT = aten._scaled_dot_product_efficient_attention


class _FusedAttention(TorchFunctionMode):
    def __init__(self, flash: bool = True) -> None:
        super().__init__()
        self.flash = flash

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.nn.functional.scaled_dot_product_attention, aten.scaled_dot_product_attention.default):
            fused = _fused_sdpa(*args, **kwargs) if self.flash else _unfused_sdpa(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


def _unfused_sdpa(
    q: Any,
    k: Any,
    v: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """Attention as Megatron-LM's CoreAttention ran it before FlashAttention (megatron/model/transformer.py,
    2021): the scores ``q k^T`` in the input's dtype, scaled, masked and soft-maxed (its
    FusedScaleMaskSoftmax), dropped out, times ``v``. torch's own math path computes bf16 in fp32."""
    if not all(isinstance(t, torch.Tensor) and t.is_meta and t.dim() == 4 for t in (q, k, v)) or enable_gqa:
        return None
    if attn_mask is not None and is_causal:
        return None
    scores = torch.matmul(q, k.transpose(-2, -1)) * (
        scale if scale is not None else q.shape[-1] ** -0.5
    )  # (B, nh, T, S)
    if is_causal:
        above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)  # (T, S)
        scores = scores.masked_fill(above, float("-inf"))
    elif attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    probs = torch.softmax(scores, dim=-1)
    if dropout_p > 0:
        probs = torch.nn.functional.dropout(probs, dropout_p)
    return torch.matmul(probs, v)  # (B, nh, T, hd)


class _GroupedFlash(torch.autograd.Function):
    """Flash attention of fewer key/value heads than query heads (grouped-query attention) as the
    fused kernels run it: each key/value head serves its group of query heads inside the kernel and
    the saved tensors are q, k, v with their own heads, the output and the log-sum-exp (flash-attn's
    ``FlashAttnFunc.forward`` saves ``q, k, v, out_padded, softmax_lse``; its README: "MQA/GQA by
    passing in KV with fewer heads than Q"; Transformer Engine's ``DotProductAttention`` calls
    it with ``num_gqa_groups`` key/value heads). The counted kernels are the CPU flash op's on the
    heads repeated (the same FLOPs); only the saved tensors differ from repeating them first."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: Any) -> Any:
        group = q.shape[1] // k.shape[1]
        out, lse = _CPU_FLASH(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), 0.0, causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        heads, group = k.shape[1], q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        dq, dk, dv = _CPU_FLASH_BACKWARD(grad, q, kk, vv, out, lse, 0.0, ctx.causal, scale=ctx.scale)
        return dq, dk.unflatten(1, (heads, group)).sum(2), dv.unflatten(1, (heads, group)).sum(2), None, None


def _fused_sdpa(
    q: Any,
    k: Any,
    v: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    if not all(isinstance(t, torch.Tensor) and t.is_meta and t.dim() == 4 for t in (q, k, v)):
        return None
    if attn_mask is not None and is_causal:
        return None
    if enable_gqa and k.shape[1] != q.shape[1]:
        if attn_mask is not None or dropout_p or v.shape[-1] != q.shape[-1] or q.shape[1] % k.shape[1]:
            return None
        out: Any = _GroupedFlash.apply(q, k, v, is_causal, scale)  # type: ignore[no-untyped-call]
        return out
    if v.shape[-1] != q.shape[-1]:  # the flash op's meta kernel gives the output q's head size
        return _EFFICIENT(q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale)[0]
    return _CPU_FLASH(q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


@contextlib.contextmanager
def fused_attention(flash: bool = True) -> Iterator[None]:
    """Within this context, attention on meta tensors takes the fused (flash) kernel's path;
    ``flash=False``: torch's math path, as attention ran before fused kernels (Megatron-LM 2021,
    BLOOM): the (T x T) scores materialised, scaled, masked, soft-maxed and dropped out by
    kernels of their own, saved for backward, and every score computed, the masked half too."""
    with _FusedAttention(flash):
        yield
