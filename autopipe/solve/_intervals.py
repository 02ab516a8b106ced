"""Costs of contiguous block ranges as numpy arrays, shared by the chain solvers.

A contiguous stage is a half-open range ``[i, j)`` of the block order (0 <= i < j <= n); a cut
between two contiguous stages is a *position* j (0 < j < n). In the contiguous case every
quantity of :mod:`autopipe.solve.problem` depends only on i, j and the stage index s:

- sums over the range (time, recompute time, static, activation bytes): ``M[i, j]``;
- ``in_bytes(i, j)``: tensors with src < i (or src == -1) and some consumer in [i, j),
  non-decreasing in j for a fixed i (but not monotone in i);
- ``cut_bytes(j)``: tensors with 0 <= src < j <= max(dsts); comm_s(j) from it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from autopipe.solve.problem import EPS, PartitionProblem

__all__ = ["position_comm", "in_bytes_matrix", "range_sums", "prefix", "stage_caps"]

Floats = NDArray[np.float64]


def prefix(values: tuple[float, ...]) -> Floats:
    """``P[j] = sum(values[:j])`` (length n + 1)."""
    out = np.zeros(len(values) + 1)
    np.cumsum(np.asarray(values, dtype=np.float64), out=out[1:])
    return out


def range_sums(values: tuple[float, ...]) -> Floats:
    """``M[i, j] = sum(values[i:j])`` for i < j (0 elsewhere), shape (n + 1, n + 1).

    Summed left to right per row (not as a prefix difference), so a range's sum does not carry
    the rounding error of everything before it.
    """
    n = len(values)
    x = np.asarray(values, dtype=np.float64)
    rows = np.where(np.arange(n)[None, :] >= np.arange(n + 1)[:, None], x[None, :], 0.0)
    out = np.zeros((n + 1, n + 1))
    np.cumsum(rows, axis=1, out=out[:, 1:])
    return out


def in_bytes_matrix(p: PartitionProblem) -> Floats:
    """``IN[i, j] = in_bytes`` of the contiguous stage [i, j), shape (n + 1, n + 1)."""
    n = p.blocks
    rows: list[NDArray[np.int64]] = []
    cols: list[NDArray[np.int64]] = []
    vals: list[Floats] = []
    for t in p.tensors:
        if not t.dsts or t.bytes == 0:
            continue
        dsts = np.array(sorted(set(t.dsts)), dtype=np.int64)
        starts = np.arange(t.src + 1, dsts[-1] + 1, dtype=np.int64)  # stages starting after src
        first = dsts[np.searchsorted(dsts, starts, side="left")]  # first consumer >= start
        rows.append(starts)
        cols.append(first + 1)  # counted once the range reaches past that consumer
        vals.append(np.full(len(starts), t.bytes))
    diff = np.zeros((n + 1, n + 2))
    if rows:
        np.add.at(diff, (np.concatenate(rows), np.concatenate(cols)), np.concatenate(vals))
    return np.cumsum(diff, axis=1)[:, : n + 1]


def position_comm(p: PartitionProblem) -> tuple[Floats, Floats]:
    """``(cut_bytes, comm_s)`` of a cut at each position j (length n + 1; 0 at 0 and n)."""
    n = p.blocks
    diff = np.zeros(n + 2)
    alive = np.zeros(n + 2, dtype=np.int64)  # tensors of non-zero size across each position
    for t in p.tensors:
        if t.src >= 0 and t.dsts and t.bytes > 0:
            diff[t.src + 1] += t.bytes
            diff[max(t.dsts) + 1] -= t.bytes
            alive[t.src + 1] += 1
            alive[max(t.dsts) + 1] -= 1
    # exactly 0 where nothing crosses (a running sum can leave rounding dust there)
    cut = np.where(np.cumsum(alive)[: n + 1] > 0, np.cumsum(diff)[: n + 1], 0.0)
    cut = np.maximum(cut, 0.0)
    comm = np.where(cut > 0, p.link_latency_s + cut / p.link_bandwidth, 0.0)
    return cut, comm


def stage_caps(p: PartitionProblem) -> Floats:
    """Per stage, the largest memory that still fits (the limit with the relative EPS)."""
    return np.asarray(p.memory_limit, dtype=np.float64) * (1.0 + EPS)
