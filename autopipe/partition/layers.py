"""The block method: every stage recomputes its first ``k`` layers whole.

Megatron-LM's ``--recompute-granularity full --recompute-method block --recompute-num-layers k``
(Narayanan et al. 2021; Korthikanti et al. 2022) checkpoints the first k transformer layers of
each pipeline stage (each model chunk under interleaving) and keeps the rest: between keeping
everything and recomputing every layer, and the same k on every stage. Which blocks that is
depends on the cuts, so it is part of the partition problem (``PartitionProblem.layers``, the
blocks that are layers, and ``recompute_layers``, k), not of a profile. For a stage, each of its
first k layer blocks i (in block order):

- keeps only its inputs per micro-batch in flight: the stage's activations lose
  ``activation_bytes[i] - inputs[i]`` (``inputs[i]``: the bytes of the tensors block i reads that
  another block, or the model's input, made; :func:`block_inputs`);
- runs its forward again in its backward: the stage's time gains ``recompute_s[i]``;
- holds its activations again while that backward runs, one layer at a time: the stage's peak
  gains the largest ``activation_bytes[i]`` of them, once.

Numbers in, numbers out; :func:`stage_terms` is what ``problem.evaluate`` adds per stage (so the
brute-force oracle prices it too), :func:`range_terms` the same per contiguous range for the
chain DP and the smallest-limit DP. Tests: tests/partition/test_layers.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

__all__ = ["block_inputs", "range_terms", "stage_terms"]

Floats = NDArray[np.float64]


class _Tensor(Protocol):
    @property
    def src(self) -> int: ...
    @property
    def dsts(self) -> tuple[int, ...]: ...
    @property
    def bytes(self) -> float: ...


class _Problem(Protocol):
    """What is read of a :class:`~autopipe.partition.problem.PartitionProblem`."""

    @property
    def recompute_s(self) -> tuple[float, ...]: ...
    @property
    def activation_bytes(self) -> tuple[float, ...]: ...
    @property
    def tensors(self) -> tuple[_Tensor, ...]: ...
    @property
    def layers(self) -> tuple[bool, ...]: ...
    @property
    def recompute_layers(self) -> int: ...


def block_inputs(p: _Problem) -> tuple[float, ...]:
    """Per block, the bytes of the tensors it reads that another block or the model's input made."""
    out = [0.0] * len(p.activation_bytes)
    for t in p.tensors:
        for d in set(t.dsts):
            if d != t.src:
                out[d] += t.bytes
    return tuple(out)


def stage_terms(p: _Problem, stage_of_block: Sequence[int], stages: int) -> tuple[list[float], ...]:
    """Per stage: (recomputed forward time, activation bytes no longer kept, peak of one
    recomputed layer) of its first ``p.recompute_layers`` layer blocks."""
    extra, saving, peak = [0.0] * stages, [0.0] * stages, [0.0] * stages
    seen = [0] * stages
    inputs = block_inputs(p)
    for i, s in enumerate(stage_of_block):
        if p.layers[i] and seen[s] < p.recompute_layers:
            seen[s] += 1
            extra[s] += p.recompute_s[i]
            saving[s] += p.activation_bytes[i] - inputs[i]
            peak[s] = max(peak[s], p.activation_bytes[i])
    return extra, saving, peak


def range_terms(p: _Problem, width: int) -> tuple[Floats, Floats, Floats]:
    """:func:`stage_terms` of every contiguous range of 1..``width`` blocks, by start: row i,
    column d - 1 is the range [i, i + d) (shape (n + 1, width); ranges past the end repeat the
    last block's sums, as the chain DP's padding does)."""
    n = len(p.activation_bytes)
    idx = np.minimum(np.arange(n + 1)[:, None] + np.arange(width)[None, :], n)  # (n+1, w), n: padding
    pad = np.zeros(n + 1, dtype=bool)
    pad[:n] = p.layers
    is_layer = pad[idx] & (np.arange(n + 1)[:, None] + np.arange(width)[None, :] < n)
    mask = is_layer & (np.cumsum(is_layer, axis=1) <= p.recompute_layers)

    def padded(values: Sequence[float]) -> Floats:
        x = np.zeros(n + 1)
        x[:n] = values
        return x

    act = padded(p.activation_bytes)
    extra = np.cumsum(np.where(mask, padded(p.recompute_s)[idx], 0.0), axis=1)
    saving = np.cumsum(np.where(mask, (act - padded(block_inputs(p)))[idx], 0.0), axis=1)
    peak = np.maximum.accumulate(np.where(mask, act[idx], 0.0), axis=1)
    return extra, saving, peak
