"""Exact dynamic program over contiguous partitions: :func:`solve_chain`.

The classic linear-partition DP (as in torchgpipe's balance-by-time, after Kakaobrain 2020,
and PipeDream's planner, Narayanan et al. 2019), extended with per-stage memory limits, a
per-stage recompute choice, and the comm of every cut including carried skip tensors. Stages
are contiguous ranges ``[i, j)`` of the given block order, so on a DAG the answer is the best
*contiguous* partition (monotone along every tensor, since the order is topological).

With ``C_s[i, j]`` the time of range [i, j) as stage s (``inf`` if it fits in neither
recompute setting; in "auto" the cheaper setting that fits, see ``problem.auto_recompute``)
and ``comm(i)`` the comm of a cut at position i:

1. min-max:  ``F_s[j] = min_i max(F_{s-1}[i], comm(i), C_s[i, j])``;  Z* = F_{S-1}[n].
2. min-sum under the bottleneck: ``G_s[j] = min_i G_{s-1}[i] + comm(i) + C_s[i, j]`` over
   ranges and cuts that are <= Z* (1 + EPS); ties (within EPS) go to fewer recomputed stages.

Each stage is one vectorised (n+1) x (n+1) step, O(S n^2) in all.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from autopipe.errors import InfeasibleError
from autopipe.solve._intervals import (
    Floats,
    in_bytes_matrix,
    position_comm,
    range_sums,
    stage_kinds,
)
from autopipe.solve.min_memory import infeasible_error
from autopipe.solve.problem import EPS, Partition, PartitionProblem, contiguous_assignment, evaluate

__all__ = ["solve_chain"]

Bools = NDArray[np.bool_]


def stage_tables(p: PartitionProblem) -> list[tuple[Floats, Bools]]:
    """Per stage s: ``(C_s, RC_s)``, time of each range as stage s (inf if it cannot fit)
    and whether it recomputes; ranges with i >= j are inf."""
    n = p.blocks
    time = range_sums(p.time_s)
    extra = range_sums(p.recompute_s)
    static = range_sums(p.static_bytes)
    act = range_sums(p.activation_bytes)
    inb = in_bytes_matrix(p) if p.recompute != "never" else None
    empty = np.tri(n + 1, dtype=bool)  # i >= j
    kinds, of_stage = stage_kinds(p)
    tables: list[tuple[Floats, Bools]] = []  # one per kind of stage (stages alike share it)
    for k, cap in kinds:
        fits_plain = (static + k * act <= cap) & ~empty
        if inb is None:
            fits_rc = np.zeros_like(fits_plain)
        else:
            fits_rc = (static + k * inb + act <= cap) & ~empty
        if p.recompute == "never":
            rc = fits_rc  # all False
            cost = np.where(fits_plain, time, np.inf)
        elif p.recompute == "always":
            rc = fits_rc
            cost = np.where(fits_rc, time + extra, np.inf)
        else:
            rc = fits_rc & ~fits_plain
            cost = np.where(fits_plain, time, np.where(rc, time + extra, np.inf))
        tables.append((cost, rc))
    return [tables[j] for j in of_stage]


def solve_chain(problem: PartitionProblem, *, explain: bool = True) -> Partition:
    """The lexicographically best contiguous partition (Z, then total, then fewer recomputes).

    Raises :class:`~autopipe.errors.InfeasibleError` (with the smallest per-device limit that
    fits) when no contiguous partition fits the memory limits; ``explain=False`` skips
    working out that limit (an O(S n^2) DP) when the caller only needs to know.
    """
    p = problem
    n, S = p.blocks, p.stages
    tables = stage_tables(p)
    _, comm = position_comm(p)

    # Phase 1: Z* = min over partitions of max(stage times, cut comms).
    f = np.full(n + 1, np.inf)
    f[0] = 0.0
    for s, (cost, _) in enumerate(tables):
        g = f if s == 0 else np.maximum(f, comm)
        f = np.maximum(g[:, None], cost).min(axis=0)
    z = float(f[n])
    if not np.isfinite(z):
        raise infeasible_error(p) if explain else InfeasibleError("no partition fits")

    # Phase 2: least total among partitions whose every piece is <= Z*, then fewest recomputes.
    bound = z + EPS * z
    comm_ok = np.where(comm <= bound, comm, np.inf)
    total = np.full(n + 1, np.inf)
    total[0] = 0.0
    count = np.zeros(n + 1)
    back = np.zeros((S, n + 1), dtype=np.int64)
    cols = np.arange(n + 1)
    for s, (cost, rc) in enumerate(tables):
        h = total if s == 0 else total + comm_ok
        cand = h[:, None] + np.where(cost <= bound, cost, np.inf)  # (start i, end j)
        best = cand.min(axis=0)
        near = (cand <= best + EPS * best) & np.isfinite(cand)
        recs = np.where(near, count[:, None] + rc, np.inf)
        fewest = recs.min(axis=0)
        choice = np.argmax(near & (recs == fewest), axis=0)  # earliest start among the ties
        back[s] = choice
        total = cand[choice, cols]
        count = fewest

    # Walk the back pointers from the end.
    starts = [0] * S
    j = n
    for s in range(S - 1, -1, -1):
        starts[s] = int(back[s, j])
        j = starts[s]
    ends = [*starts[1:], n]
    rcs = tuple(bool(tables[s][1][starts[s], ends[s]]) for s in range(S))
    return evaluate(p, contiguous_assignment(starts, n), rcs)
