"""The smallest per-device memory limit under which a contiguous partition exists.

Time is ignored: this is the min-max linear-partition DP with stage memory as the cost,
``F_s[j] = min_i max(F_{s-1}[i], mem_s(i, j))``, where ``mem_s`` is the stage memory of
:mod:`autopipe.partition.problem` with recomputation where the mode allows it ("auto": the
smaller of the two; "always": recomputing; "never": not). It feeds the one-line
:class:`~autopipe.errors.InfeasibleError` every solver raises when nothing fits.

Tests: tests/partition/test_solvers.py.
"""

from __future__ import annotations

import numpy as np

from autopipe.errors import InfeasibleError
from autopipe.partition._intervals import in_bytes_matrix, range_sums
from autopipe.partition.layers import range_terms
from autopipe.partition.problem import PartitionProblem
from autopipe.units import format_bytes

__all__ = ["infeasible_error", "min_memory_limit"]


def min_memory_limit(problem: PartitionProblem) -> float:
    """Smallest single limit L (the same on every stage) under which some contiguous
    partition into ``problem.stages`` stages fits; ``problem.stage_memory_limit`` is ignored."""
    p = problem
    n = p.blocks
    static = range_sums(p.static_bytes)
    act = range_sums(p.activation_bytes)
    peak = np.zeros_like(act)
    if p.recompute_layers:  # the block method (partition/layers.py): [i, j) is row i, column j - i - 1
        _, saving, top = range_terms(p, n)
        i, j = np.triu_indices(n + 1, 1)
        act[i, j] -= saving[i, j - i - 1]
        peak[i, j] = top[i, j - i - 1]
    inb = in_bytes_matrix(p) if p.recompute != "never" else None
    empty = np.tri(n + 1, dtype=bool)
    f = np.full(n + 1, np.inf)
    f[0] = 0.0
    for s in range(p.stages):
        k = p.inflight[s]
        plain = static + k * act + peak
        if inb is None:
            mem = plain
        elif p.recompute == "always":
            mem = static + k * inb + act
        else:
            mem = np.minimum(plain, static + k * inb + act)
        mem = np.where(empty, np.inf, mem)
        f = np.maximum(f[:, None], mem).min(axis=0)
    return float(f[n])


def infeasible_error(problem: PartitionProblem, min_bytes: float | None = None) -> InfeasibleError:
    """The error for "nothing fits", naming the smallest limit that would (contiguous
    partitions unless ``min_bytes`` is given)."""
    p = problem
    need = min_memory_limit(p) if min_bytes is None else min_bytes
    limits = set(p.stage_memory_limit)
    if len(limits) == 1:
        have = f"{format_bytes(p.stage_memory_limit[0])} per device"
    else:
        have = "the per-stage limits (" + ", ".join(format_bytes(x) for x in p.stage_memory_limit) + ")"
    fixes = "more stages, recomputation, or smaller micro-batches"
    if p.recompute != "never":
        fixes = "more stages or smaller micro-batches"
    return InfeasibleError(
        f"no partition of {p.blocks} blocks into {p.stages} stages fits {have}; the smallest "
        f"limit that fits is {format_bytes(need, round_up=True)} per device (or use {fixes})",
        min_memory_bytes=need,
    )
