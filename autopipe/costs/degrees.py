"""One device's share of a block at a layout of tensor, context and expert parallelism.

A layout's degrees travel as one value, :class:`Degrees`: tensor parallelism
(``costs.tensor.TensorSplit``: t, sequence parallelism, the node's link), context parallelism
(``costs.context.ContextSplit``: cp, its link) and expert parallelism
(``costs.experts.ExpertSplit``: ep, etp, imbalance, the links the all-to-all crosses); any of
them None is degree 1. Per block, from its counted ops (``costs.counting``):

    ops      the dense ops split by t (``tensor.split_ops``), then by cp (``context.context_ops``);
             the expert-marked ops by all of them (``experts.expert_ops``: the device holds
             1 / (t cp) of the block's tokens, E / ep of its experts)
    comm     t's collectives (``tensor.comm_s``), each MoE layer's all-to-alls
             (``experts.alltoall_s``), each attention layer's key/value ring beyond what the
             device's attention hides (``context.kv_exchange_s``)
    saved    ``tensor.split_saved``, then / cp
    params   dense ones by t (``tensor.split_params``), routed experts' / (ep etp)

``costs.analytic.profile_from_counts`` prices these on a device into one device's Profile.
Pure: no torch.

Tests: tests/costs/test_experts.py.
Tests: tests/costs/test_context_parallel.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autopipe.costs.context import ContextSplit, context_ops, kv_exchange_s
from autopipe.costs.counting import OpCount
from autopipe.costs.experts import ExpertSplit, alltoall_s, expert_ops
from autopipe.costs.tensor import BlockKind, TensorSplit, comm_s, split_ops, split_params, split_saved

__all__ = ["Degrees", "device_comm", "device_ops", "device_params", "device_saved"]


@dataclass(frozen=True)
class Degrees:
    """The parallel degrees one device's profile is priced at (None: degree 1)."""

    tensor: TensorSplit | None = None
    context: ContextSplit | None = None
    experts: ExpertSplit | None = None

    @property
    def t(self) -> int:
        return self.tensor.degree if self.tensor else 1

    @property
    def cp(self) -> int:
        return self.context.degree if self.context else 1

    @property
    def ep(self) -> int:
        return self.experts.degree if self.experts else 1

    @property
    def sequence_parallel(self) -> bool:
        return bool(self.tensor and self.tensor.sequence_parallel)

    def describe(self) -> str:
        """``t=2 with sequence parallelism, cp=4, ep=8`` ('' at degree 1 everywhere)."""
        parts = []
        if self.t > 1:
            parts.append(f"t={self.t}{' with sequence parallelism' if self.sequence_parallel else ''}")
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.experts is not None and (self.ep > 1 or self.experts.tensor > 1):
            etp = f" x etp={self.experts.tensor}" if self.experts.tensor > 1 else ""
            parts.append(f"ep={self.ep}{etp} (imbalance {self.experts.imbalance:g})")
        return ", ".join(parts)


def device_ops(ops: Sequence[OpCount], kind: BlockKind, d: Degrees) -> tuple[OpCount, ...]:
    """One device's ops of a block of ``kind`` (see the module docstring)."""
    dense = [op for op in ops if not op.expert] if d.experts else list(ops)
    out = split_ops(dense, kind, d.t, d.sequence_parallel)
    if d.context is not None:
        out = context_ops(out, d.context)
    if d.experts is not None:
        out += expert_ops([op for op in ops if op.expert], d.experts, 1.0 / (d.t * d.cp))
    return out


def device_comm(
    kind: BlockKind,
    u: float,
    d: Degrees,
    element_bytes: float,
    moe_layers: int = 0,
    attention: int = 0,
    attention_s: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float]:
    """(forward, backward) seconds of a block's communication per micro-batch of ``u``:
    ``moe_layers`` of its layers are MoE, ``attention`` of them attend, the device's attention
    taking ``attention_s`` (forward, backward) in all, which the ring's transfers overlap."""
    fwd = bwd = 0.0
    if d.tensor is not None:
        fwd, bwd = comm_s(kind, u, d.tensor, element_bytes)
    if d.experts is not None and moe_layers:
        tokens = u * d.experts.shape.seq / (d.t * d.cp)
        f, b = alltoall_s(d.experts, tokens, element_bytes)
        fwd, bwd = fwd + moe_layers * f, bwd + moe_layers * b
    if d.context is not None and attention:
        per_layer = attention_s[0] / attention, attention_s[1] / attention
        f, b = kv_exchange_s(d.context, u, element_bytes, per_layer)
        fwd, bwd = fwd + attention * f, bwd + attention * b
    return fwd, bwd


def device_saved(saved_bytes: float, kind: BlockKind, d: Degrees) -> float:
    """Bytes one device saves for backward of a block of ``kind``."""
    return split_saved(saved_bytes, kind, d.t, d.sequence_parallel) / d.cp


def device_params(params: int, expert_params: int, kind: BlockKind, d: Degrees) -> tuple[int, int]:
    """(all, routed-expert) parameter elements one device holds of a block owning ``params``,
    ``expert_params`` of them routed experts'."""
    dense = params - expert_params
    if d.tensor is not None and kind != "whole":
        dense = split_params(dense, kind, d.t, d.tensor.shape)
    mine = math.ceil(expert_params / (d.ep * d.experts.tensor)) if d.experts is not None else expert_params
    return dense + mine, mine
