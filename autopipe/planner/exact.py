"""Every contiguous split of one decision, in the order of a lower bound on its simulated time.

For a decision (schedule, v, m) with K = S·v chunks and n blocks there are C(n-1, K-1)
contiguous splits. Up to :data:`ENUMERATE_LIMIT` of them, :func:`split_table` prices all at
once with numpy — no simulation — in two exact-or-bounding ways:

- **memory, exactly.** A device's peak in the simulator depends only on the order of its
  actions, not on their times: after each action it holds its chunks' static bytes plus
  ``count_j × held_j`` (a forward adds a micro-batch of chunk j, a backward — or the W of a split
  backward — drops it), and a backward momentarily adds the recomputed chunk's activations (or,
  with the block method, the largest of its recomputed layers', ``partition/layers.py``). The
  count rows are read once per compiled schedule (:func:`memory_rows`, any placement: V, zigzag,
  round-robin), so every split's per-device peak is a few matrix products, with the same
  recomputation rule as :func:`~autopipe.partition.problem.evaluate`. Splits whose peak exceeds
  the limit are dropped before anything is simulated.
- **time, a lower bound** (``F, B, W`` per chunk as the simulator takes them, recomputation
  and the executor's cost per action included; communication only on links between devices):
  every device works ``m Σ(F + B + W)`` over its chunks; micro-batch 0 crosses every chunk
  forward and back (``Σ F + Σ B``, then chunk 0's W, plus every link twice); and for each
  chunk j of device r, r's work on its chunks from j on cannot start before a forward has
  crossed chunks ``< j``, and after the last of its backwards the gradient still crosses them
  back (on a V, the up chunk waits for the whole way down).

:mod:`autopipe.planner.search` simulates the splits in bound order (with :func:`price_split`,
the one pricing function) and stops when the next bound is no better than the best plan found,
so the plan it returns is the best contiguous split of its decision set under the simulator.
Above the limit the search falls back to the chain solver's cuts and local moves.

Before the arrays, what is cheap: where no split holds even one micro-batch
(``partition/reach.py``'s walk) the table is empty at once; where the caller does not explain an
empty table (``explain`` False: a search with a time to beat), each chunk's most in-flight
micro-batches give every split a least peak, and where none fits the table is empty without the
exact peaks; and only the splits that fit are bounded (tests/planner/test_shortcuts.py: the same
plans without these).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from autopipe.partition._intervals import InBytes, position_comm, prefix
from autopipe.partition.layers import range_terms
from autopipe.partition.problem import SCREEN_SLACK, PartitionProblem, memory_cap
from autopipe.partition.reach import cannot_fit
from autopipe.planner.pricing import BlockTimes, Decision, Schedules
from autopipe.schedules import schedule_spec
from autopipe.schedules.spec import ScheduleSpec

__all__ = ["ENUMERATE_LIMIT", "SplitTable", "memory_rows", "split_table"]

ENUMERATE_LIMIT = 50_000
"""Most contiguous splits of one decision priced all at once (numpy arrays of this many rows)."""

ENUMERATE_CHUNK_RUNS = 16_384
"""Most chunk x micro-batch pairs (S·v·m) of a decision whose memory rows are read (the walk
is pure Python); larger schedules go to the chain solver."""

BOUND_SLACK = 1e-9
"""Bounds are sums in another order than the simulator's: shaved by this (relative) to stay below."""

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]


@dataclass(frozen=True)
class SplitTable:
    """One decision's contiguous splits that fit, fastest bound first."""

    sizes: Ints  # (N, K) blocks per chunk
    bounds: Floats  # (N,) lower bounds on the simulated iteration, ascending
    need: float  # the smallest per-device limit any split of this decision fits (inf: none)
    tight: bool = True  # some split does not fit with nothing recomputed (memory binds this decision)


@dataclass(frozen=True)
class DeviceRows:
    """What one device holds, as counts per chunk, after each of its actions and before each B."""

    chunks: tuple[int, ...]
    held: Floats  # (U, c): micro-batches of each chunk held after an action (distinct rows)
    before_b: Floats  # (V, c): held just before a backward ...
    b_chunk: Ints  # (V,): ... of this chunk (local index), whose recomputed activations it adds
    # the same rows less those another row holds at least as many of every chunk as (with the
    # same b_chunk): with bytes per chunk >= 0 they never give the peak (:func:`_frontier`)
    held_top: Floats | None = None
    before_top: Floats | None = None
    b_top: Ints | None = None


KNOWN_KINDS = frozenset((0, 1, 2))
"""The compiled action kinds (F, B, W) whose memory and time these tables model; a schedule with
another kind (an overlapped F&B, say) is left to the chain solver and the simulator."""


def memory_rows(
    name: str, devices: int, micro_batches: int, virtual: int, schedules: Schedules | None = None
) -> tuple[DeviceRows, ...] | None:
    """Per device, its held-count rows under schedule ``name`` (see the module docstring);
    None when the schedule has an action kind besides F, B and W (kept in ``schedules``)."""
    schedules = Schedules() if schedules is None else schedules
    key = (name, devices, micro_batches, virtual)
    if key not in schedules.rows:
        schedules.rows[key] = _memory_rows(schedules, *key)
    rows: tuple[DeviceRows, ...] | None = schedules.rows[key]
    return rows


def _memory_rows(
    schedules: Schedules, name: str, devices: int, micro_batches: int, virtual: int
) -> tuple[DeviceRows, ...] | None:
    c = schedules.compiled(name, devices, micro_batches, virtual)
    if not KNOWN_KINDS.issuperset(np.unique(c.kind).tolist()):
        return None
    step = np.where(c.kind == 0, 1, np.where(c.split, 0, -1))  # what each action does to its chunk's count
    out = []
    for r in range(devices):
        chunks = tuple(j for j in range(c.num_stages) if c.home[j] == r)
        local = np.zeros(c.num_stages, np.int64)
        local[list(chunks)] = np.arange(len(chunks))
        i = c.rank_lists[r]
        k = local[c.stage[i]]
        delta = np.zeros((len(i), len(chunks)), np.int64)
        delta[np.arange(len(i)), k] = step[i]
        counts = np.concatenate([np.zeros((1, len(chunks)), np.int64), np.cumsum(delta, axis=0)])
        rows = np.unique(counts.astype(np.float64), axis=0)  # held after each action (and before any)
        is_b = c.kind[i] == 1
        b = np.unique(np.column_stack([counts[:-1][is_b], k[is_b]]).reshape(-1, len(chunks) + 1), axis=0)
        before, b_chunk = b[:, :-1].astype(np.float64), b[:, -1]
        tops = [(_frontier(before[b_chunk == j]), j) for j in np.unique(b_chunk).tolist()]
        before_top = np.concatenate([t for t, _ in tops]) if tops else before
        b_top = np.concatenate([np.full(len(t), j, dtype=np.int64) for t, j in tops]) if tops else b_chunk
        out.append(DeviceRows(chunks, rows, before, b_chunk, _frontier(rows), before_top, b_top))
    return tuple(out)


FRONTIER_ROUNDS = 256
"""Most rows :func:`_frontier` keeps before it gives up and keeps them all (each round is a pass
over the rows left)."""


def _frontier(rows: Floats) -> Floats:
    """The rows of ``rows`` (distinct) that no other row is at least in every column: for any
    ``h >= 0``, ``max(rows @ h)`` is that of these (a dropped row's product is at most its
    dominating row's, rounding included: rounding is monotone). All of them where more than
    :data:`FRONTIER_ROUNDS` would stay."""
    rest = rows[np.argsort(-rows.sum(axis=1), kind="stable")]
    kept: list[Floats] = []
    while len(rest):  # the largest sum left is dominated by no row left: keep it, drop what it dominates
        if len(kept) == FRONTIER_ROUNDS:
            return rows
        top = rest[0]
        kept.append(top)
        rest = rest[1:][~(rest[1:] <= top).all(axis=1)]
    return np.asarray(kept, dtype=np.float64).reshape(-1, rows.shape[1])


def split_count(blocks: int, chunks: int) -> int:
    return math.comb(blocks - 1, chunks - 1)


def _all_cuts(blocks: int, chunks: int, schedules: Schedules) -> Ints:
    """Every choice of K-1 cut positions in 1..n-1, lexicographic, shape (N, K-1) (kept in ``schedules``)."""
    hit = schedules.cuts.get((blocks, chunks))
    if hit is None:
        hit = schedules.cuts[blocks, chunks] = _cuts_of(blocks, chunks)
    return hit


def _cuts_of(blocks: int, chunks: int) -> Ints:
    if chunks == 1:
        return np.zeros((1, 0), dtype=np.int64)
    flat = np.fromiter(
        itertools.chain.from_iterable(itertools.combinations(range(1, blocks), chunks - 1)), dtype=np.int64
    )
    return flat.reshape(-1, chunks - 1)


def split_table(
    problem: PartitionProblem,
    times: BlockTimes,
    decision: Decision,
    devices: int,
    memory_limit: float,
    explain: bool = True,
) -> SplitTable | None:
    """All contiguous splits of ``decision`` that fit, by bound (None: more than the limit).
    ``explain`` False: the table's ``need`` may be inf where no split fits (the caller does not
    explain), which a walk over the chunks' most in-flight micro-batches then proves at once."""
    p, d = problem, decision
    n, K, m = p.blocks, p.stages, d.micro_batches
    if split_count(n, K) > ENUMERATE_LIMIT or K * m > ENUMERATE_CHUNK_RUNS:
        return None
    if cannot_fit(p, (1.0,) * K, (memory_cap(memory_limit),) * K):  # the floor below, proved in one walk
        return SplitTable(np.zeros((0, K), dtype=np.int64), np.zeros(0), math.inf)
    cuts = _all_cuts(n, K, times.schedules)
    N = len(cuts)
    starts = np.concatenate([np.zeros((N, 1), dtype=np.int64), cuts], axis=1)
    ends = np.concatenate([cuts, np.full((N, 1), n, dtype=np.int64)], axis=1)

    def chunk(values: tuple[float, ...]) -> Floats:
        pre = prefix(values)
        return np.asarray(np.maximum(pre[ends] - pre[starts], 0.0), dtype=np.float64)

    static, act = chunk(p.static_bytes), chunk(p.activation_bytes)
    layer_extra, layer_peak = np.zeros_like(act), np.zeros_like(act)
    if p.recompute_layers:  # the block method (partition/layers.py): each chunk's first layers
        extra, saving, peak = range_terms(p, n)
        at = (starts, ends - starts - 1)
        act, layer_extra, layer_peak = act - saving[at], extra[at], peak[at]
    inb = InBytes(p).at(starts, ends) if p.recompute != "never" else np.zeros_like(act)
    k = np.asarray(p.inflight)[None, :]
    cap = memory_cap(np.asarray(p.stage_memory_limit, dtype=np.float64)[None, :])
    fits_plain = static + k * act + layer_peak <= cap
    fits_rc = static + k * inb + act <= cap
    rc = np.full_like(fits_plain, p.recompute == "always") if p.recompute != "auto" else ~fits_plain & fits_rc
    zero = np.zeros_like(act)
    slack = memory_cap(memory_limit, SCREEN_SLACK)  # a split is dropped only when surely over
    placed = spec_of(d).devices_of(devices, d.virtual)
    # a device holds its static bytes, and a micro-batch of any of its chunks
    if not (_floor(static, act, placed, devices).max(axis=1) <= slack).any():  # nothing can fit: no schedule to compile
        return SplitTable(np.zeros((0, K), dtype=np.int64), np.zeros(0), math.inf)
    rows = memory_rows(d.schedule, devices, m, d.virtual, times.schedules)
    if rows is None:
        return None
    if not explain and not (_floor(static, _least_held(p, rows, act, inb), placed, devices).max(axis=1) <= slack).any():
        return SplitTable(np.zeros((0, K), dtype=np.int64), np.zeros(0), math.inf)  # nothing fits: memory binds
    worst = _peaks(rows, static, np.where(rc, inb, act), np.where(rc, act, layer_peak), devices).max(axis=1)
    tight = p.recompute == "always" or bool((worst > slack).any())
    if p.recompute == "auto":  # as price_split: nothing recomputed when every device fits without it
        plain = _peaks(rows, static, act, zero, devices).max(axis=1)
        rc &= (plain > slack)[:, None]  # near the limit: as if not, to keep the time bound below
        worst = np.where(plain <= slack, np.minimum(plain, worst), worst)
        tight = bool((plain > slack).any())
    need = float(worst.min()) if N else math.inf
    order = np.flatnonzero(worst <= slack)  # the splits that fit, bounded (each row's bound is its own)
    splits = spec_of(d).splits_backward
    bounds = _time_bounds(p, times, splits, placed, m, starts[order], ends[order], rc[order], layer_extra[order])
    ranked = np.argsort(bounds, kind="stable")
    order = order[ranked]
    return SplitTable(ends[order] - starts[order], bounds[ranked] * (1.0 - BOUND_SLACK), need, tight)


def _floor(static: Floats, held: Floats, placed: tuple[int, ...], devices: int) -> Floats:
    """Each split's least peak per device, shape (N, S): its chunks' static bytes and the most
    ``held`` (bytes per chunk, (N, K)) of any one of them."""
    floor = np.zeros((len(static), devices))
    for r in range(devices):
        idx = [j for j, x in enumerate(placed) if x == r]
        floor[:, r] = static[:, idx].sum(axis=1) + held[:, idx].max(axis=1)
    return floor


def _least_held(p: PartitionProblem, rows: tuple[DeviceRows, ...], act: Floats, inb: Floats) -> Floats:
    """Per split and chunk (N, K), bytes its device holds at least besides the static ones, in
    any recomputation the mode allows (what ``_peaks`` adds, less the other chunks' share): the
    most micro-batches of the chunk held at once times its activations; recomputed, that many
    times its inputs, or its activations again while its backward runs."""
    most = np.zeros(p.stages)
    for dev in rows:
        most[list(dev.chunks)] = dev.held.max(axis=0)
    plain = act * most[None, :]
    if p.recompute == "never":
        return plain
    again = np.maximum(act, inb * most[None, :])
    return again if p.recompute == "always" else np.minimum(plain, again)


def spec_of(d: Decision) -> ScheduleSpec:
    return schedule_spec(d.schedule)


def _peaks(rows: tuple[DeviceRows, ...], static: Floats, held: Floats, transient: Floats, devices: int) -> Floats:
    """Each split's simulated peak per device, shape (N, S), from per-chunk bytes (N, K)."""
    peak = np.zeros((len(static), devices))
    least = bool((held >= 0).all())  # no chunk's bytes negative: the frontier rows give the same peaks
    for r, dev in enumerate(rows):
        idx = list(dev.chunks)
        h = held[:, idx]
        on, before, b_chunk = dev.held, dev.before_b, dev.b_chunk
        if least and dev.held_top is not None and dev.before_top is not None and dev.b_top is not None:
            on, before, b_chunk = dev.held_top, dev.before_top, dev.b_top
        top = (h @ on.T).max(axis=1)
        if len(b_chunk):
            top = np.maximum(top, (h @ before.T + transient[:, idx][:, b_chunk]).max(axis=1))
        peak[:, r] = static[:, idx].sum(axis=1) + np.maximum(top, 0.0)
    return peak


def _time_bounds(
    p: PartitionProblem,
    t: BlockTimes,
    split: bool,
    placed: tuple[int, ...],
    m: int,
    starts: Ints,
    ends: Ints,
    rc: NDArray[np.bool_],
    layer_extra: Floats,
) -> Floats:
    """The module docstring's lower bound on each split's simulated iteration, shape (N,)
    (``layer_extra``: the block method's recomputed forward per chunk)."""
    N, K = starts.shape

    def chunk(values: tuple[float, ...]) -> Floats:
        pre = prefix(values)
        return np.asarray(np.maximum(pre[ends] - pre[starts], 0.0), dtype=np.float64)

    o = t.action_s
    f, b = chunk(t.f), chunk(t.b)
    extra = np.where(rc, f, layer_extra)
    fc = f + o
    if split:
        bc = chunk(t.bi) + extra + o
        wc = chunk(t.w) + o
        bc[:, 0] = o  # the first chunk's backward is all W (pricing.costs_of)
        wc[:, 0] = b[:, 0] + extra[:, 0] + o
    else:
        bc = b + extra + o
        wc = np.zeros_like(bc)
    _, comm_at = position_comm(p)
    link = np.zeros((N, K))  # link[:, c]: comm entering chunk c (between chunk c-1 and c, different devices)
    for c in range(1, K):
        if placed[c] != placed[c - 1]:
            link[:, c] = comm_at[starts[:, c]]
    into_f = np.cumsum(fc + link, axis=1) - fc  # forward of micro-batch 0 reaches chunk j's start
    back_b = np.cumsum(bc + link, axis=1) - bc  # ... and its gradient, from chunk j's start, back to chunk 0 (B only)
    bound = (fc + bc + 2 * link).sum(axis=1) + (wc[:, 0] if split else 0.0)
    for r in range(max(placed) + 1):
        mine = [j for j, x in enumerate(placed) if x == r]
        for k, first in enumerate(mine):  # the device's work on its chunks from ``first`` on
            later = mine[k:]
            busy = m * (fc[:, later] + bc[:, later] + wc[:, later]).sum(axis=1)
            work = m * (fc[:, later] + bc[:, later]).sum(axis=1)
            after = back_b[:, first] + (wc[:, 0] if split and first > 0 else 0.0)
            bound = np.maximum(bound, into_f[:, first] + np.maximum(busy, work + after))
    return np.asarray(bound, dtype=np.float64)
