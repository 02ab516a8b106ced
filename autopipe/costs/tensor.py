"""Tensor parallelism (Megatron-LM style) in the analytic cost model: a block's counts at degree t.

Shoeybi et al. 2019 ("Megatron-LM") split each transformer layer over ``t`` devices of one
node: the query/key/value and first MLP matmuls column-wise, the attention output and second
MLP matmuls row-wise, so each device runs ``heads / t`` attention heads and ``1 / t`` of the
MLP. Korthikanti et al. 2022 add *sequence parallelism*: the layer norms, dropouts and residual
adds between the split regions run on ``1 / t`` of the sequence instead of whole on every
device. What this module prices, per block, from its counted ops (``costs.counting``):

- **Transformer layers** (the model's repeated layers; ``t`` must divide the attention heads
  and the key/value heads, else that ``t`` is skipped with a reason). Ops that count FLOPs
  (matmuls, attention) run ``flops / t`` and move ``bytes / t``; the per-op overhead stays
  whole, so the roofline (``analytic.op_time``) prices the smaller matmuls' lost efficiency.
  A GEMM's largest dimension is divided by ``t`` for the efficiency curve (its size,
  ``(M K N) ** (1/3)``, prices it): Megatron shards each linear layer's larger weight dimension (``3h``,
  ``4h``, the vocabulary; ``h`` of the square attention output), the largest of the GEMM's three
  wherever the weight's dimensions exceed the micro-batch's tokens.
  A fused kernel of attention's core (``costs.fusion``: ``kind`` ``"heads"``) moves ``bytes / t``.
  Other memory-bound ops (FLOPs 0) move ``bytes * (r + (1 - r) / t)`` where ``r = 10 / 34`` is
  the share of a layer's element-wise traffic outside the split regions without sequence
  parallelism (Korthikanti et al., section 4.2.2: 10 of the 34 ``sbh`` bytes), ``r = 0``
  with it. Parameters: ``params / t`` (Megatron keeps the layer norms and the row-parallel
  biases whole: under 0.1% of a layer, counted as split). Communication per layer and
  micro-batch: two all-reduces of the ``b * s * h`` activation in the forward and two in the
  backward (input gradients), over the node's link; with sequence parallelism each becomes a
  reduce-scatter plus an all-gather of the same volume, so the same time. They add to the
  block's time, less the share ``TensorSplit.overlap`` hides behind its computation
  (:func:`exposed`; 0 by default: serial, as Megatron runs them without ``--tp-comm-overlap``). Activations saved
  for backward: ``saved * (r + (1 - r) / t)`` (Korthikanti's ``sbh (10 + 24 / t)`` without
  sequence parallelism, ``34 sbh / t`` with it; the ``5 a s / h`` attention-score term is not
  there at all: the counts price fused attention, which saves only q, k, v, the output and
  the log-sum-exp — what Megatron's *selective* recomputation keeps — and recomputes the
  scores in its backward, a cost the counted backward FLOPs include).
- **The token embedding and the LM head** are vocabulary-parallel as in Megatron: each device
  holds ``vocab / t`` rows (Megatron pads the vocabulary to a multiple of ``t``); the LM
  head's matmul and its loss (cross entropy over vocabulary shards) run ``1 / t``, the
  embedding lookup whole; one all-reduce of ``b * s * h`` after the lookup (forward) and one
  of the LM head's input gradient (backward); the loss's three small all-reduces of ``b * s``
  values are left out.
- **Everything else** (position embedding, final norm, loose ops): replicated, whole on
  every device of the group, as Megatron runs them.

The structure (hidden size, heads, key/value heads, sequence, vocabulary, which blocks are
layers) comes from the model: its ``config`` fields (``n_embd``/``hidden_size``,
``n_head``/``num_attention_heads``, ``n_kv_head``/``num_key_value_heads``, ``vocab_size``),
the layers as the children of its longest ``nn.ModuleList``, the sequence from the layer's
input shape in the trace. A model without them is planned with ``t = 1`` only. Pure apart
from :func:`transformer_shape`, which reads a module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from autopipe.costs.counting import OpCount

__all__ = [
    "REPLICATED_SHARE",
    "BlockKind",
    "TensorSplit",
    "TransformerShape",
    "block_kinds",
    "comm_s",
    "exposed",
    "shape_of",
    "split_ops",
    "split_params",
    "split_saved",
    "tensor_degrees",
    "tensor_reason",
    "transformer_shape",
]

REPLICATED_SHARE = 10.0 / 34.0  # Korthikanti et al. 2022: sbh(10 + 24/t) of a layer's 34 sbh

BlockKind = str  # "layer", "embedding", "head", "whole"


@dataclass(frozen=True)
class TransformerShape:
    """What tensor parallelism needs to know about a decoder-only transformer."""

    hidden: int  # h
    heads: int  # a: attention (query) heads
    kv_heads: int  # key/value heads (= heads without grouped-query attention)
    seq: int  # s: tokens per sample
    vocab: int  # V
    layers: tuple[str, ...]  # block names of the transformer layers
    embedding: tuple[str, ...] = ()  # blocks holding the (V, h) token embedding
    head: tuple[str, ...] = ()  # blocks holding the LM head (V outputs) and the loss


@dataclass(frozen=True)
class TensorSplit:
    """Degree ``t`` over one node's link, with or without sequence parallelism."""

    shape: TransformerShape
    degree: int  # t
    sequence_parallel: bool
    link_bandwidth: float  # bytes/s, one direction, per device (NVLink)
    link_latency_s: float
    overlap: float = 0.0  # the share of the collectives hidden behind the block's computation (0: serial)


def tensor_degrees(
    shape: TransformerShape | None, devices_per_node: int, devices: int
) -> tuple[list[int], list[tuple[int, str]]]:
    """The degrees t to search (t divides the node, the devices, the heads and the key/value
    heads) and one line for each divisor of the node that is skipped, saying why."""
    if shape is None:
        return [1], []
    ok: list[int] = []
    skipped: list[tuple[int, str]] = []
    for t in range(1, devices_per_node + 1):
        if devices_per_node % t:
            continue
        why = tensor_reason(shape, t, devices_per_node, devices)
        if why:
            skipped.append((t, why))
        else:
            ok.append(t)
    return ok, skipped


def tensor_reason(shape: TransformerShape | None, t: int, devices_per_node: int, devices: int) -> str:
    """Why degree ``t`` cannot be used ('' when it can)."""
    if t == 1:
        return ""
    if shape is None:
        return (
            "the model has no transformer layers autopipe can split (tensor parallelism needs an analytic plan of one)"
        )
    if devices_per_node % t:
        return f"a tensor-parallel group stays within a node; {t} does not divide {devices_per_node} devices per node"
    if devices % t:
        return f"{t} does not divide {devices} devices"
    if shape.heads % t:
        return f"{t} does not divide the {shape.heads} attention heads"
    if shape.kv_heads % t:
        return f"{t} does not divide the {shape.kv_heads} key/value heads"
    return ""


def block_kinds(names: Sequence[str], shape: TransformerShape) -> tuple[BlockKind, ...]:
    """How each block splits: ``layer``, ``embedding``, ``head`` or ``whole`` (replicated)."""
    layers, emb, head = set(shape.layers), set(shape.embedding), set(shape.head)
    return tuple(
        "layer" if n in layers else "embedding" if n in emb else "head" if n in head else "whole" for n in names
    )


def _sharded(dims: tuple[float, ...], t: int) -> tuple[float, ...]:
    """A GEMM's (M, K, N) on one of ``t`` devices: its largest dimension split (module docstring)."""
    if not dims:
        return dims
    i = max(range(len(dims)), key=lambda j: dims[j])
    return tuple(d / t if j == i else d for j, d in enumerate(dims))


def split_ops(ops: Sequence[OpCount], kind: BlockKind, t: int, sequence_parallel: bool) -> tuple[OpCount, ...]:
    """One device's ops of a block of ``kind`` at degree ``t`` (see the module docstring)."""
    if t == 1 or kind == "whole":
        return tuple(ops)
    r = 0.0 if sequence_parallel else REPLICATED_SHARE
    out = []
    for op in ops:
        if op.flops > 0:
            out.append(replace(op, flops=op.flops / t, bytes=op.bytes / t, dims=_sharded(op.dims, t)))
        elif op.kind == "heads":
            out.append(replace(op, bytes=op.bytes / t))  # a fused kernel of attention's core: the device's heads
        elif kind == "layer":
            out.append(OpCount(0.0, op.bytes * (r + (1.0 - r) / t)))
        elif kind == "head":
            out.append(OpCount(0.0, op.bytes / t))  # logits and the loss over vocabulary shards
        else:
            out.append(op)  # the embedding lookup: whole on every device
    return tuple(out)


def allreduce_s(nbytes: float, group: int, bandwidth: float, latency_s: float) -> float:
    """Ring all-reduce among ``group`` devices: 2 (t - 1) / t * bytes / bandwidth + 2 (t - 1) latency
    (a reduce-scatter plus an all-gather: the same time)."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (group - 1) / group * nbytes / bandwidth + 2.0 * (group - 1) * latency_s


def comm_s(kind: BlockKind, micro_batch_size: float, split: TensorSplit, element_bytes: float) -> tuple[float, float]:
    """(forward, backward) seconds of a block's tensor-parallel collectives per micro-batch."""
    t = split.degree
    if t == 1 or kind == "whole":
        return 0.0, 0.0
    nbytes = micro_batch_size * split.shape.seq * split.shape.hidden * element_bytes
    one = allreduce_s(nbytes, t, split.link_bandwidth, split.link_latency_s)
    if kind == "layer":
        return 2.0 * one, 2.0 * one
    if kind == "embedding":
        return one, 0.0
    return 0.0, one  # head: the input gradient of a column-parallel matmul


def exposed(compute_s: float, comm: float, split: TensorSplit | None) -> float:
    """A block's time with its collectives: ``compute + comm - min(overlap x comm, compute)``; the
    hidden share (``TensorSplit.overlap``, Megatron-LM's ``--tp-comm-overlap`` pipelines the
    collectives with the GEMMs) cannot hide more than the block computes."""
    hidden = min(split.overlap * comm, compute_s) if split is not None else 0.0
    return compute_s + comm - hidden


def split_saved(saved_bytes: float, kind: BlockKind, t: int, sequence_parallel: bool) -> float:
    """Bytes one device saves for backward, of a block of ``kind`` at degree ``t``."""
    if t == 1 or kind in ("whole", "embedding"):
        return saved_bytes
    if kind == "head":
        return saved_bytes / t
    r = 0.0 if sequence_parallel else REPLICATED_SHARE
    return saved_bytes * (r + (1.0 - r) / t)


def split_params(params: int, kind: BlockKind, t: int, shape: TransformerShape) -> int:
    """Parameter elements one device holds of a block of ``kind`` owning ``params`` of them."""
    if t == 1 or kind == "whole":
        return params
    if kind == "layer":
        return math.ceil(params / t)
    table = shape.vocab * shape.hidden  # the (V, h) matrix, if this block owns it
    if params >= table:
        return params - table + math.ceil(table / t)
    return params


# --------------------------------------------------------------------------- the model


_HIDDEN = ("n_embd", "hidden_size", "d_model", "dim")
_HEADS = ("n_head", "num_attention_heads", "n_heads", "num_heads")
_KV = ("n_kv_head", "num_key_value_heads", "n_kv_heads", "num_kv_heads")
_VOCAB = ("vocab_size", "n_vocab", "padded_vocab_size")


def _first(config: Any, names: Sequence[str]) -> int | None:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def transformer_shape(
    model: Any, block_names: Sequence[str], layer_input_shape: Sequence[int] | None
) -> TransformerShape | None:
    """The structure of ``model`` (an ``nn.Module``) as :class:`TransformerShape`, or None when
    it has no config with hidden size and heads, or no list of layers among ``block_names``.

    ``layer_input_shape``: the first layer's input at micro-batch size 1, ``(1, s, h)``.
    """
    from torch import nn

    config = getattr(model, "config", None)
    hidden, heads = _first(config, _HIDDEN), _first(config, _HEADS)
    if config is None or hidden is None or heads is None:
        return None
    kv = _first(config, _KV) or heads
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        return None
    prefix, longest = max(lists, key=lambda x: len(x[1]))
    wanted = {f"{prefix}.{i}" for i in range(len(longest))}
    layers = tuple(n for n in block_names if n in wanted)
    if not layers:
        return None
    vocab = _first(config, _VOCAB)
    emb: list[str] = []
    head: list[str] = []
    if vocab is not None:
        for name, m in model.named_modules():
            if isinstance(m, nn.Embedding) and m.num_embeddings == vocab and name in block_names:
                emb.append(name)
            if isinstance(m, nn.Linear) and m.out_features == vocab and name in block_names:
                head.append(name)
    shape = tuple(layer_input_shape or ())
    if len(shape) < 3 or shape[-1] != hidden:
        return None
    seq = math.prod(shape[1:-1])
    return TransformerShape(hidden, heads, kv, seq, vocab or 0, layers, tuple(emb), tuple(head))


def shape_of(traced: Any, model: Any) -> TransformerShape | None:
    """The structure of ``model`` traced as ``traced`` (a ``TracedModel``): the sequence is the
    first layer's input at micro-batch size 1, ``(1, s, h)``."""
    from autopipe.costs.measure.measured import crossing_tensors

    names = [b.name for b in traced.blocks]
    probe = transformer_shape(model, names, (1, 1, _first(getattr(model, "config", None), _HIDDEN) or 0))
    if probe is None:
        return None
    first = names.index(probe.layers[0])
    crossing = [t.shape for t in crossing_tensors([traced]) if first in t.dsts and t.shape[-1:] == (probe.hidden,)]
    return transformer_shape(model, names, crossing[0]) if crossing else None
