"""Costs of contiguous block ranges as numpy arrays, shared by the chain solvers.

A contiguous stage is a half-open range ``[i, j)`` of the block order (0 <= i < j <= n); a cut
between two contiguous stages is a *position* j (0 < j < n). In the contiguous case every
quantity of :mod:`autopipe.partition.problem` depends only on i, j and the stage index s:

- sums over the range (time, recompute time, static, activation bytes): ``M[i, j]``;
- ``in_bytes(i, j)``: tensors with src < i (or src == -1) and some consumer in [i, j),
  non-decreasing in j for a fixed i (but not monotone in i);
- ``cut_bytes(j)``: tensors with 0 <= src < j <= max(dsts); comm_s(j) from it.

Tests: tests/partition/test_chain.py.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from autopipe.partition.problem import PartitionProblem, memory_cap

__all__ = [
    "InBytes",
    "in_bytes_diff",
    "in_bytes_matrix",
    "position_comm",
    "prefix",
    "range_sums",
    "stage_caps",
    "stage_kinds",
]

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]


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


def _in_bytes_entries(p: PartitionProblem) -> tuple[Ints, Ints, Floats]:
    """``(row, col, bytes)``: a stage starting at block ``row`` takes the tensor as input once
    its range reaches past ``col - 1`` (the first consumer at or after ``row``)."""
    seg_lo: list[int] = []
    seg_hi: list[int] = []
    seg_b: list[float] = []
    for t in p.tensors:
        if not t.dsts or t.bytes == 0:
            continue
        lo = t.src + 1  # starts after the producer (any start for a model input)
        for d in sorted(set(t.dsts)):
            seg_lo.append(lo)  # starts lo..d all meet consumer d first
            seg_hi.append(d)
            seg_b.append(t.bytes)
            lo = d + 1
    lo_a = np.asarray(seg_lo, dtype=np.int64)
    lengths = np.asarray(seg_hi, dtype=np.int64) - lo_a + 1
    offsets = np.cumsum(lengths) - lengths
    rows = np.repeat(lo_a, lengths) + (np.arange(int(lengths.sum())) - np.repeat(offsets, lengths))
    cols = np.repeat(np.asarray(seg_hi, dtype=np.int64) + 1, lengths)
    return rows, cols, np.repeat(np.asarray(seg_b, dtype=np.float64), lengths)


def in_bytes_diff(p: PartitionProblem) -> Floats:
    """Shape (n + 1, n + 2): row i summed up to column j is ``in_bytes`` of [i, j) (zero up
    to column i)."""
    n = p.blocks
    rows, cols, vals = _in_bytes_entries(p)
    diff = np.bincount(rows * (n + 2) + cols, weights=vals, minlength=(n + 1) * (n + 2))
    return np.asarray(diff.reshape(n + 1, n + 2), dtype=np.float64)


def in_bytes_matrix(p: PartitionProblem) -> Floats:
    """``IN[i, j] = in_bytes`` of the contiguous stage [i, j), shape (n + 1, n + 1)."""
    n = p.blocks
    return np.asarray(np.cumsum(in_bytes_diff(p), axis=1)[:, : n + 1], dtype=np.float64)


class InBytes:
    """``in_bytes(i, j)`` of contiguous ranges, looked up for arrays of (i, j) pairs.

    Sparse (one entry per start and tensor it can be an input of) instead of an (n+1)^2 matrix;
    for a fixed i the value is non-decreasing in j.
    """

    def __init__(self, p: PartitionProblem) -> None:
        n = self.n = p.blocks
        rows, cols, vals = _in_bytes_entries(p)
        keys = rows * (n + 2) + cols
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.cum = np.concatenate([[0.0], np.cumsum(vals[order])])
        # cumulative total before each row's first entry
        self.row_base = self.cum[np.searchsorted(self.keys, np.arange(n + 1) * (n + 2))]

    def at(self, i: Ints, j: Ints) -> Floats:
        pos = np.searchsorted(self.keys, i * (self.n + 2) + j, side="right")
        return np.asarray(self.cum[pos] - self.row_base[i], dtype=np.float64)


def position_comm(p: PartitionProblem) -> tuple[Floats, Floats]:
    """``(cut_bytes, comm_s)`` of a cut at each position j (length n + 1; 0 at 0 and n)."""
    n = p.blocks
    crossing = [(t.src + 1, max(t.dsts) + 1, t.bytes) for t in p.tensors if t.src >= 0 and t.dsts and t.bytes > 0]
    first = np.asarray([c[0] for c in crossing], dtype=np.int64)
    after = np.asarray([c[1] for c in crossing], dtype=np.int64)
    size = np.asarray([c[2] for c in crossing], dtype=np.float64)
    diff = np.bincount(first, size, n + 2) - np.bincount(after, size, n + 2)
    # number of tensors of non-zero size across each position
    alive = np.bincount(first, minlength=n + 2) - np.bincount(after, minlength=n + 2)
    # exactly 0 where nothing crosses (a running sum can leave rounding dust there)
    cut = np.where(np.cumsum(alive)[: n + 1] > 0, np.cumsum(diff)[: n + 1], 0.0)
    cut = np.maximum(cut, 0.0)
    cut[0] = cut[n] = 0.0
    comm = np.where(cut > 0, p.link_latency_s + cut / p.link_bandwidth, 0.0)
    return cut, comm


def stage_caps(p: PartitionProblem) -> Floats:
    """Per stage, the largest memory that still fits (:func:`~autopipe.partition.problem.memory_cap`:
    the limit with the relative EPS; the C probe compares with these caps as given)."""
    return memory_cap(np.asarray(p.stage_memory_limit, dtype=np.float64))


def stage_kinds(p: PartitionProblem) -> tuple[list[tuple[float, float]], list[int]]:
    """Stages that fit alike: the distinct (in-flight count, memory cap) pairs, and each
    stage's index among them. Every stage of GPipe and ZB-H1 is one kind; the chunks of an
    interleaved rank are one kind; so per-stage tables need computing once per kind."""
    caps = stage_caps(p)
    keys = [(float(p.inflight[s]), float(caps[s])) for s in range(p.stages)]
    kinds = list(dict.fromkeys(keys))
    index = {k: j for j, k in enumerate(kinds)}
    return kinds, [index[k] for k in keys]
