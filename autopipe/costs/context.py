"""Context parallelism (CP) in the analytic cost model: a block's counts with the sequence split.

Context parallelism (Megatron-Core's ``--context-parallel-size``; ring attention, Liu et al.
2023; Llama 3's long-context phase used CP 16) splits every sample's sequence over ``cp``
devices for the whole model: each device holds ``s / cp`` tokens of every activation, so every
op that works token by token -- the linear layers, norms, element-wise ops, the embedding,
the LM head and its loss -- runs ``1 / cp`` of its FLOPs and bytes (a GEMM keeps its other
dimensions: its size ``(M K N) ** (1/3)`` shrinks by ``cp ** (1/3)``), and each device saves
``1 / cp`` of the activations. Attention needs every earlier token's keys and values:

- **Work per device.** Under a causal mask the later tokens attend to more. Split into ``cp``
  contiguous chunks, device r does ``(2 r + 1) / cp**2`` of the attention, the last one
  ``(2 cp - 1) / cp**2`` -- nearly twice its share; Megatron splits the sequence into ``2 cp``
  chunks and gives device r chunks ``r`` and ``2 cp - 1 - r``, so every device does exactly
  ``1 / cp`` (:func:`attention_share`). The ring runs ``cp`` steps, one partial attention of
  the local queries against one device's keys and values each: ``cp`` kernels of ``1 / cp``
  of the device's attention (each paying the per-op overhead), each reading its chunks.
- **Key/value exchange per layer (ring).** Each step passes the device's keys and values,
  ``u * s / cp * kv_width`` elements, to the next device while the attention of the step runs,
  ``cp - 1`` times in the forward; the backward passes the keys and values and their gradients,
  twice that (:func:`kv_exchange_s`). What a step's transfer takes beyond the step's
  attention compute is paid: ``(cp - 1) * max(0, transfer - attention / cp)``.
- **Parameters** are whole on every CP rank (their gradients are reduced over ``d cp``).

``kv_width`` is one token's key and value elements over the key/value heads: ``2 * kv_heads *
head_dim`` with grouped-query attention, ``heads * (qk_head_dim + v_head_dim)`` with
multi-head latent attention (the up-projected keys and values travel, as in Megatron-Core).
Pure apart from :func:`context_shape`, which reads a model's config.

Tests: tests/costs/test_context_parallel.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from autopipe.costs.counting import OpCount

__all__ = [
    "ContextShape",
    "ContextSplit",
    "attention_share",
    "context_ops",
    "context_reason",
    "context_shape",
    "kv_exchange_s",
]


@dataclass(frozen=True)
class ContextShape:
    """What context parallelism needs to know about a model's attention."""

    kv_width: int  # one token's key + value elements over all key/value heads
    seq: int  # tokens per sample


@dataclass(frozen=True)
class ContextSplit:
    """Degree ``cp`` over a link (NVLink when the CP group is within a node)."""

    shape: ContextShape
    degree: int  # cp
    link_bandwidth: float  # bytes/s per device, one direction
    link_latency_s: float = 10e-6
    balanced: bool = True  # Megatron's 2 cp chunks (False: cp contiguous chunks)


def context_reason(shape: ContextShape | None, cp: int, seq: int | None = None) -> str:
    """Why degree ``cp`` cannot be used ('' when it can): the sequence must split into ``2 cp``
    equal chunks (Megatron's load balancing)."""
    if cp < 1:
        return f"context parallel {cp}: use a whole number >= 1"
    if cp == 1:
        return ""
    if shape is None:
        return "the model has no attention autopipe can split by sequence (context parallelism needs an analytic plan)"
    s = shape.seq if seq is None else seq
    if s % (2 * cp):
        return f"the sequence of {s} tokens does not split into 2 x {cp} equal chunks"
    return ""


def attention_share(cp: int, balanced: bool = True) -> float:
    """The busiest device's share of a causal attention split ``cp`` ways (module docstring)."""
    if cp <= 1:
        return 1.0
    return 1.0 / cp if balanced else (2.0 * cp - 1.0) / (cp * cp)


def context_ops(ops: Sequence[OpCount], split: ContextSplit) -> tuple[OpCount, ...]:
    """One device's ops of a block at degree ``cp`` (module docstring)."""
    cp = split.degree
    if cp == 1:
        return tuple(ops)
    share = attention_share(cp, split.balanced)
    out: list[OpCount] = []
    for op in ops:
        if op.kind == "attention":  # cp ring steps, each 1/cp of the device's attention
            out.extend([replace(op, flops=op.flops * share / cp, bytes=op.bytes / cp)] * cp)
        else:
            dims = (op.dims[0] / cp, *op.dims[1:]) if op.dims else op.dims
            out.append(replace(op, flops=op.flops / cp, bytes=op.bytes / cp, dims=dims))
    return tuple(out)


def attention_layers(ops: Sequence[OpCount]) -> int:
    """Attention layers in a block's forward ops: its fused attention kernels."""
    return sum(op.kind == "attention" for op in ops)


def kv_exchange_s(
    split: ContextSplit, micro_batch_size: float, element_bytes: float, attention_s: tuple[float, float]
) -> tuple[float, float]:
    """(forward, backward) seconds of one attention layer's ring exchange that its attention
    compute (``attention_s``: the device's forward and backward attention seconds) does not
    hide (module docstring)."""
    cp = split.degree
    if cp <= 1:
        return 0.0, 0.0
    chunk = micro_batch_size * split.shape.seq / cp * split.shape.kv_width * element_bytes
    step = chunk / split.link_bandwidth + split.link_latency_s
    forward = (cp - 1) * max(0.0, step - attention_s[0] / cp)
    backward = (cp - 1) * max(0.0, 2.0 * step - attention_s[1] / cp)
    return forward, backward


def _first(config: Any, names: Sequence[str]) -> int | None:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def context_shape(model: Any, seq: int) -> ContextShape | None:
    """The attention structure of ``model`` from its config (Hugging Face's names and the
    bundled files'), for a sequence of ``seq`` tokens; None without heads and a hidden size."""
    config = getattr(model, "config", None)
    heads = _first(config, ("n_head", "num_attention_heads", "n_heads", "num_heads"))
    hidden = _first(config, ("n_embd", "hidden_size", "d_model", "dim"))
    if heads is None or hidden is None:
        return None
    nope, rope = _first(config, ("qk_nope_head_dim",)), _first(config, ("qk_rope_head_dim",))
    v_dim = _first(config, ("v_head_dim",))
    if getattr(config, "attention", "mla") == "mla" and nope and rope and v_dim:  # multi-head latent attention
        return ContextShape(heads * (nope + rope + v_dim), seq)
    kv = _first(config, ("n_kv_head", "num_key_value_heads", "n_kv_heads", "num_kv_heads")) or heads
    head_dim = _first(config, ("head_dim", "kv_channels")) or hidden // heads
    return ContextShape(2 * kv * head_dim, seq)
