"""Exact dynamic program over contiguous partitions: :func:`solve_chain`.

The classic linear-partition DP (as in torchgpipe's balance-by-time, after Kakaobrain 2020,
and PipeDream's planner, Narayanan et al. 2019), extended with per-stage memory limits, a
per-stage recompute choice (or the block method's first k layers of every stage,
``partition/layers.py``), and the comm of every cut including carried skip tensors. Stages
are contiguous ranges ``[i, j)`` of the given block order, so on a DAG the answer is the best
*contiguous* partition (monotone along every tensor, since the order is topological).

With ``C_s[i, j]`` the time of range [i, j) as stage s (``inf`` if it fits in neither
recompute setting; in "auto" the cheaper setting that fits, see ``problem.auto_recompute``)
and ``comm(i)`` the comm of a cut at position i:

1. min-max:  ``F_s[j] = min_i max(F_{s-1}[i], comm(i), C_s[i, j])``;  Z* = F_{S-1}[n].
2. min-sum under the bottleneck: ``G_s[j] = min_i G_{s-1}[i] + comm(i) + C_s[i, j]`` over
   ranges and cuts that are <= Z* (1 + EPS); ties (within EPS) go to fewer recomputed stages.

**Banded.** Only ranges whose time is at most a bound U can matter once Z* <= U, and those are
at most W blocks long (W from U; range times only grow with the length). So each stage is one
vectorised W x (n+1) step over ``[d, j]`` (range ``[j-d, j)``), O(S n W) in all: phase 1 with
U = 2 max(largest block, total / S); when that gives z > U (some partition attains z, so
Z* <= z), again with U = 2 z; when it gives none, with no bound at all. Min and max are exact,
so once Z* (1 + EPS) <= U the entries left out change no value <= U. Range sums are summed
left to right per range (as a full (n+1)^2 table would be), so the answer is the full table's,
bit for bit. The bands are kept per set of blocks (the search's decisions at one micro-batch
size share them) and per kind of stage (``stage_kinds``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from autopipe.errors import InfeasibleError
from autopipe.partition._intervals import Floats, in_bytes_diff, position_comm, prefix, stage_kinds
from autopipe.partition.layers import range_terms
from autopipe.partition.min_memory import infeasible_error
from autopipe.partition.problem import (
    EPS,
    Partition,
    PartitionProblem,
    contiguous_assignment,
    evaluate,
)

__all__ = ["solve_chain"]

Bools = NDArray[np.bool_]
Ints = NDArray[np.int64]


class _Band:
    """Range sums of one set of blocks for ranges of 1..W blocks, as ``[r, j]`` arrays: row r
    is the range ``[j - d, j)`` with d = W - r (row 0 the longest, so the earliest start
    comes first); entries with j - d < 0 are not ranges (``valid`` False)."""

    def __init__(self, p: PartitionProblem, width: int, inb_diff: Floats | None) -> None:
        n = p.blocks
        self.width = w = width
        d = np.arange(w, 0, -1)[:, None]  # range length per row
        j = np.arange(n + 1)[None, :]
        start = j - d
        self.valid = start >= 0
        self.start = np.where(self.valid, start, n + 1)  # n + 1: a padded inf in the DP vectors
        rows = np.clip(start, 0, n)
        cols = np.broadcast_to(d - 1, start.shape)

        def band(values: tuple[float, ...]) -> Floats:
            x = np.zeros(n + w)
            x[:n] = values
            per_start = np.cumsum(x[np.arange(n + 1)[:, None] + np.arange(w)[None, :]], axis=1)
            return np.asarray(per_start[rows, cols], dtype=np.float64)

        self.time = band(p.time_s)
        self.extra = band(p.recompute_s)
        self.static = band(p.static_bytes)
        self.act = band(p.activation_bytes)
        self.peak = np.zeros_like(self.act)  # the block method's (partition/layers.py): one layer again
        if p.recompute_layers:
            extra, saving, peak = (np.asarray(x[rows, cols], dtype=np.float64) for x in range_terms(p, w))
            self.time, self.act, self.peak = self.time + extra, self.act - saving, peak
        self.inb: Floats | None = None
        if inb_diff is not None:  # in_bytes(i, j): the diff row of start i summed from column i
            pad = np.zeros((n + 1, n + 2 + w))
            pad[:, : n + 2] = inb_diff
            per_start = np.cumsum(
                pad[np.arange(n + 1)[:, None], np.arange(n + 1)[:, None] + np.arange(w + 1)[None, :]], axis=1
            )
            self.inb = np.asarray(per_start[rows, cols + 1], dtype=np.float64)
        self._kinds: dict[tuple[float, float, str], tuple[Floats, Bools]] = {}

    def tables(self, p: PartitionProblem, kinds: list[tuple[float, float]]) -> list[tuple[Floats, Bools]]:
        """Per kind of stage (in-flight count, memory cap): ``(C, RC)``, the time of each range
        as such a stage (inf if it cannot fit) and whether it recomputes; new kinds all at once."""
        new = [kc for kc in dict.fromkeys(kinds) if (kc[0], kc[1], p.recompute) not in self._kinds]
        if new:
            k = np.asarray([kc[0] for kc in new])[:, None, None]
            cap = np.asarray([kc[1] for kc in new])[:, None, None]
            time, extra, static, act = self.time, self.extra, self.static, self.act
            fits_plain = (static + k * act + self.peak <= cap) & self.valid
            if self.inb is None:
                fits_rc = np.zeros_like(fits_plain)
            else:
                fits_rc = (static + k * self.inb + act <= cap) & self.valid
            if p.recompute == "never":
                rc = fits_rc  # all False
                cost = np.where(fits_plain, time, np.inf)
            elif p.recompute == "always":
                rc = fits_rc
                cost = np.where(fits_rc, time + extra, np.inf)
            else:
                rc = fits_rc & ~fits_plain
                cost = np.where(fits_plain, time, np.where(rc, time + extra, np.inf))
            for x, kc in enumerate(new):
                self._kinds[kc[0], kc[1], p.recompute] = cost[x], rc[x]
        return [self._kinds[kc[0], kc[1], p.recompute] for kc in kinds]


class _Blocks:
    """What solve_chain keeps of one set of blocks: comm per position and bands by width."""

    def __init__(self, p: PartitionProblem) -> None:
        self.comm = position_comm(p)[1]
        self.time = prefix(p.time_s)
        self.static, self.act = prefix(p.static_bytes), prefix(p.activation_bytes)
        self.inb_diff = in_bytes_diff(p) if p.recompute != "never" else None
        self.layers = p.recompute_layers  # the block method's k: its bands are its own
        self.bands: dict[int, _Band] = {}
        # answers by (stages, in-flight counts, limits, mode); None: nothing fits
        self.answers: dict[tuple[object, ...], Partition | None] = {}

    def band(self, p: PartitionProblem, bound: float, share: float, cap: float) -> _Band:
        """A band holding every range whose time is <= ``bound`` and whose static bytes plus
        ``share`` times its activations are <= ``cap`` (what every range that fits a stage
        meets: ``share`` = min(1, least in-flight count), ``cap`` the largest stage's)."""
        n = p.blocks
        width, start = n, np.arange(n + 1)
        held = self.static if self.layers else self.static + share * self.act  # the block method keeps less
        for pre, most in ((self.time, bound), (held, cap)):
            if most < np.inf:
                reach = np.searchsorted(pre, pre + most, side="right") - 1
                width = min(width, int((reach - start).max()) + 2)
        width = max(width, 1)
        while True:
            band = self.bands.get(width)
            if band is None:
                band = self.bands[width] = _Band(p, width, self.inb_diff)
            # the longest ranges must be out wherever they are ranges (sums only grow)
            longest = (band.time[0] <= bound) & (band.static[0] + share * band.act[0] + band.peak[0] <= cap)
            if width == n or not longest[band.valid[0]].any():
                return band
            width = min(n, 2 * width)


def _blocks_of(p: PartitionProblem) -> _Blocks:
    """The :class:`_Blocks` of ``p``'s blocks, kept in ``p.memo`` when it has one (its answers
    serve every problem on the same blocks and links)."""
    if p.memo is None or not p.memo.owns(p):
        return _Blocks(p)
    rest = (p.link_latency_s, p.link_bandwidth, p.recompute != "never", p.recompute_layers)
    hit: _Blocks | None = p.memo.chain.get(rest)
    if hit is None:
        hit = p.memo.chain[rest] = _Blocks(p)
    return hit


def _bottleneck(p: PartitionProblem, band: _Band, comm: Floats, tables: list[tuple[Floats, Bools]]) -> float:
    """Phase 1 over the band: Z* if it is at most the band's bound (else something above it)."""
    n = p.blocks
    f = np.full(n + 2, np.inf)
    f[0] = 0.0
    g = f.copy()
    for s, (cost, _) in enumerate(tables):
        if s:
            np.maximum(f[: n + 1], comm, out=g[: n + 1])
        else:
            g[:] = f
        f[: n + 1] = np.maximum(g[band.start], cost).min(axis=0)
    return float(f[n])


def solve_chain(problem: PartitionProblem, *, explain: bool = True) -> Partition:
    """The lexicographically best contiguous partition (Z, then total, then fewer recomputes).

    Raises :class:`~autopipe.errors.InfeasibleError` (with the smallest per-device limit that
    fits) when no contiguous partition fits the memory limits; ``explain=False`` skips
    working out that limit (an O(S n^2) DP) when the caller only needs to know.
    """
    p = problem
    kept = _blocks_of(p)
    key = (p.stages, p.inflight, p.stage_memory_limit, p.recompute)
    if key not in kept.answers:
        kept.answers[key] = _solve(p, kept)
    answer = kept.answers[key]
    if answer is None:
        raise infeasible_error(p) if explain else InfeasibleError("no partition fits")
    return answer


def _solve(p: PartitionProblem, kept: _Blocks) -> Partition | None:
    n, S = p.blocks, p.stages
    comm = kept.comm
    kinds, of_stage = stage_kinds(p)
    lower = max(max(p.time_s), float(kept.time[n]) / S)
    share = min(1.0, *(k for k, _ in kinds))
    cap = max(c for _, c in kinds)
    limit = 2.0 * lower
    while True:
        band = kept.band(p, limit, share, cap)
        by_kind = band.tables(p, kinds)
        tables = [by_kind[j] for j in of_stage]
        z = _bottleneck(p, band, comm, tables)
        if z + EPS * z <= limit or limit == np.inf or band.width == n:
            break
        # a partition of the band's ranges attains z, so Z* <= z: a band to z holds it
        limit = 2.0 * z if np.isfinite(z) else np.inf
    if not np.isfinite(z):
        return None

    # Phase 2: least total among partitions whose every piece is <= Z*, then fewest recomputes.
    bound = z + EPS * z
    comm_ok = np.where(comm <= bound, comm, np.inf)
    capped = [np.where(cost <= bound, cost, np.inf) for cost, _ in by_kind]
    any_rc = any(rc.any() for _, rc in by_kind)
    total = np.full(n + 2, np.inf)
    total[0] = 0.0
    h = total.copy()
    count = np.zeros(n + 2)
    back = np.zeros((S, n + 1), dtype=np.int64)
    cols = np.arange(n + 1)
    w = band.width
    for s in range(S):
        kind = of_stage[s]
        if s:
            np.add(total[: n + 1], comm_ok, out=h[: n + 1])
        else:
            h[:] = total
        cand = h[band.start] + capped[kind]  # (range row, end j)
        best = cand.min(axis=0)
        near = (cand <= best + EPS * best) & np.isfinite(cand)
        if any_rc:
            recs = np.where(near, count[band.start] + by_kind[kind][1], np.inf)
            fewest = recs.min(axis=0)
            choice = np.argmax(near & (recs == fewest), axis=0)  # earliest start among the ties
            count[: n + 1] = fewest
        else:
            choice = np.argmax(near, axis=0)
        back[s] = cols - (w - choice)
        total[: n + 1] = cand[choice, cols]

    # Walk the back pointers from the end.
    starts = [0] * S
    j = n
    for s in range(S - 1, -1, -1):
        starts[s] = int(back[s, j])
        j = starts[s]
    ends = [*starts[1:], n]
    rcs = tuple(bool(tables[s][1][w - (ends[s] - starts[s]), ends[s]]) for s in range(S))
    return evaluate(p, contiguous_assignment(starts, n), rcs)
