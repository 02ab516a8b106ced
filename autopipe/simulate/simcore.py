"""The simulator's hot loops on flat arrays: compiled (``_simcore.c``) or in Python.

:mod:`autopipe.simulate.events` compiles a schedule once and prices many candidates on it;
both steps are loops over every action (300,000 for 64 devices x 1,536 micro-batches x F, B,
W), run here on integer and float arrays:

- :func:`order` — the schedule's actions in an order that respects every dependency (each
  rank's list in order, each action once its inputs are placed, ranks visited round-robin), with
  each action's dependencies as positions in that order;
- :func:`run` — every action's start and end, each rank's busy time and the iteration time, for
  K candidates (K rows of durations and link times) in one call;
- :func:`memory` — each rank's peak bytes, walking its own list.

Each has two implementations that give the same numbers to the last bit (the same floating-point
operations in the same order; tested): the C extension ``autopipe.simulate._simcore``, built by
``pip install`` when a C compiler is there (20-130x faster; bench/bench_simulate.py), and the
Python loops below — the reference, and the fallback when the extension is missing or
``AUTOPIPE_NO_SIMCORE=1`` is set (:func:`autopipe.native.use_native` switches every C extension
at run time).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from autopipe import native

__all__ = [
    "Floats",
    "Index",
    "Ints",
    "Order",
    "memory",
    "order",
    "run",
]

Ints = npt.NDArray[np.int64]
Index = npt.NDArray[np.int32]  # per action (int32: half the memory to fill for 300,000 actions)
Floats = npt.NDArray[np.float64]


_C = native.load(native.SIMULATOR)  # None where not built: the Python loops below


class Order(NamedTuple):
    """:func:`order`'s arrays, per action in dependency order (``pos``: per row)."""

    rank: Index
    stage: Index
    kind: Index
    dep: Index  # (N, 2)
    hop: Index  # (N, 2)
    pos: Index
    dur: Index
    split: npt.NDArray[np.bool_]


def order(rows: Ints, offsets: Ints, home: Ints, m: int, has_w: bool) -> tuple[int, Order]:
    """Dependency order of the ranks' lists.

    ``rows`` is every rank's ``(stage, kind, micro-batch)`` rows, rank after rank (``offsets``:
    rank ``r``'s are ``offsets[r]:offsets[r+1]``), ``home[j]`` the rank of stage ``j``, ``m`` the
    micro-batches, ``has_w`` whether the schedule has W actions. Returns ``(placed, Order)``: per
    action in dependency order its rank, stage and kind; ``dep`` ``(N, 2)``, the positions of its
    dependencies (F(j-1) for F(j); F(j), then B(j+1) for B(j); B(j) for W(j); -1 none); ``hop``
    ``(N, 2)``, the ``comm_s`` index each dependency pays (-1: same rank or none); ``dur``,
    ``stage * 8 +`` 0 F, 1 B, 2 B input-grad, 3 W (where its time is in a row of :func:`run`'s
    ``durations``); ``split``, a B with a W; and ``pos[i]``, the position of ``rows[i]``.
    ``placed`` is the number of actions placed (fewer than N: deadlock), or -1 when a row is out
    of range, on another rank than its stage's, or repeated (the arrays are then undefined)."""
    total, ranks, n = len(rows), len(offsets) - 1, len(home)
    if total > 2**30:
        raise ValueError("simcore.order: over 2**30 actions")
    out = Order(
        np.empty(total, np.int32),
        np.empty(total, np.int32),
        np.empty(total, np.int32),
        np.empty((total, 2), np.int32),
        np.empty((total, 2), np.int32),
        np.empty(total, np.int32),
        np.empty(total, np.int32),
        np.empty(total, np.bool_),
    )
    if _C is not None and native.enabled():
        placed = _C.order(rows, offsets, home, ranks, n, m, has_w, *out)
        return int(placed), out
    stage, kind, mb = rows[:, 0], rows[:, 1], rows[:, 2]
    owner = np.repeat(np.arange(ranks), np.diff(offsets))
    fine = (stage >= 0) & (stage < n) & (kind >= 0) & (kind <= (2 if has_w else 1)) & (mb >= 0) & (mb < m)
    if not fine.all() or (home[stage] != owner).any():
        return -1, out
    keys = (stage * 3 + kind) * m + mb
    if len(np.unique(keys)) != total:
        return -1, out
    placed = _order(keys.tolist(), stage.tolist(), kind.tolist(), offsets.tolist(), home.tolist(), m, out)
    st, kd = out.stage[:placed], out.kind[:placed]
    out.split[:placed] = (kd == 1) & has_w
    out.dur[:placed] = st * 8 + np.where(kd == 0, 0, np.where(kd == 2, 3, 2 if has_w else 1))
    return placed, out


def _order(
    keys: list[int], stage: list[int], kind: list[int], off: list[int], home: list[int], m: int, out: Order
) -> int:
    n, ranks, per_stage = len(home), len(off) - 1, 3 * m
    position = [-1] * (n * per_stage)
    rank: list[int] = []
    d0s: list[int] = []
    d1s: list[int] = []
    h0s: list[int] = []
    h1s: list[int] = []
    order: list[int] = []  # row index of each placed action
    pointer = off[:-1]
    progress = True
    # A plain loop (no generators): this runs once per action, tens of thousands of times.
    while progress:
        progress = False
        for r in range(ranks):
            i, end = pointer[r], off[r + 1]
            while i < end:
                key, s, k = keys[i], stage[i], kind[i]
                d0 = d1 = h0 = h1 = -1
                if k == 0:  # F(j) needs F(j-1)
                    if s > 0:
                        d0 = position[key - per_stage]
                        if d0 < 0:
                            break
                        if home[s - 1] != home[s]:
                            h0 = s - 1
                else:  # B(j) needs F(j) and B(j+1); W(j) needs B(j)
                    d0 = position[key - m]
                    if d0 < 0:
                        break
                    if k == 1 and s + 1 < n:
                        d1 = position[key + per_stage]
                        if d1 < 0:
                            break
                        if home[s + 1] != home[s]:
                            h1 = s
                position[key] = len(order)
                order.append(i)
                rank.append(r)
                d0s.append(d0)
                d1s.append(d1)
                h0s.append(h0)
                h1s.append(h1)
                i += 1
                progress = True
            pointer[r] = i
    placed = len(order)
    rows_of = np.asarray(order, dtype=np.int64)
    out[0][:placed] = rank
    out[1][:placed] = np.asarray(stage, dtype=np.int64)[rows_of]
    out[2][:placed] = np.asarray(kind, dtype=np.int64)[rows_of]
    out[3][:placed, 0], out[3][:placed, 1] = d0s, d1s
    out[4][:placed, 0], out[4][:placed, 1] = h0s, h1s
    out[5][rows_of] = np.arange(placed)
    return placed


def run(
    rank: Index,
    dur: Index,
    dep: Index,
    hop: Index,
    durations: Floats,
    comm: Floats,
    ranks: int,
    *,
    starts: bool = False,
) -> tuple[Floats, Floats, Floats, Floats]:
    """Simulate K candidates of one ordered schedule (:func:`order`'s ``rank``, ``dep``, ``hop``;
    ``dur[i]`` indexes a row of ``durations``, ``(K, D)`` (the planner's: :func:`memory`'s
    ``costs`` seen as ``(K, 8n)``); ``hop`` indexes a row of ``comm``, ``(K, C)``). Each action
    starts when its rank is free and each dependency has ended (plus the hop's link time) and
    runs its duration. Returns ``(iteration (K,), busy (K, ranks), start (N,), end (N,))``; start
    and end are the last candidate's (start only with ``starts=True`` on the Python path)."""
    k, total = len(durations), len(rank)
    start, end = np.empty(total, np.float64), np.empty(total, np.float64)
    busy, iteration = np.empty((k, ranks), np.float64), np.empty(k, np.float64)
    if _C is not None and native.enabled():
        _C.run(rank, dur, dep, hop, durations, comm, ranks, k, start, end, busy, iteration)
        return iteration, busy, start, end
    columns = (
        rank.tolist(),
        dep[:, 0].tolist(),
        hop[:, 0].tolist(),
        dep[:, 1].tolist(),
        hop[:, 1].tolist(),
        dur.tolist(),
    )
    for c in range(k):
        d, link = durations[c].tolist(), comm[c].tolist()
        st: list[float] = []
        en: list[float] = []
        free, b = [0.0] * ranks, [0.0] * ranks
        keep, put = st.append, en.append
        # A plain loop over zipped columns (no indexing): this runs once per action.
        for r, q0, g0, q1, g1, u in zip(*columns, strict=True):
            t0 = free[r]
            if q0 >= 0:
                t = en[q0] if g0 < 0 else en[q0] + link[g0]
                if t > t0:
                    t0 = t
            if q1 >= 0:
                t = en[q1] if g1 < 0 else en[q1] + link[g1]
                if t > t0:
                    t0 = t
            x = d[u]
            if starts:
                keep(t0)
            e = t0 + x
            put(e)
            free[r] = e
            b[r] += x
        iteration[c] = max(en)
        busy[c] = b
    end[:] = en
    if starts:
        start[:] = st
    return iteration, busy, start, end


def memory(rows: Ints, offsets: Ints, home: Ints, has_w: bool, costs: Floats) -> Floats:
    """Peak bytes per rank for K candidates, ``(K, ranks)``; ``costs`` is ``(K, n, 8)``, per
    stage :class:`~autopipe.simulate.events.StageCost`'s fields in order (times, then
    activation, weight-grad, transient and static bytes). Walking each rank's rows (as for
    :func:`order`) in order from the static bytes of its stages (``home``): F holds the
    activation, B frees it (all but the weight-grad part when the backward is split, which W
    frees); the peak also sees held + transient while a B or a W runs."""
    k, ranks = len(costs), len(offsets) - 1
    peak = np.empty((k, ranks), np.float64)
    if _C is not None and native.enabled():
        _C.memory(rows, offsets, home, has_w, costs, ranks, k, peak)
        return peak
    rw, off, hm = rows.tolist(), offsets.tolist(), home.tolist()
    for c in range(k):
        act, wg, tr, static = (costs[c, :, f].tolist() for f in (4, 5, 6, 7))
        freed = [a - w for a, w in zip(act, wg, strict=True)] if has_w else act
        for r in range(ranks):
            held = sum(static[j] for j in range(len(hm)) if hm[j] == r)
            top = held
            for j, kind, _ in rw[off[r] : off[r + 1]]:
                if kind == 0:
                    held += act[j]
                elif kind == 1:
                    if held + tr[j] > top:
                        top = held + tr[j]
                    held -= freed[j]
                else:
                    if held + tr[j] > top:
                        top = held + tr[j]
                    held -= wg[j]
                if held > top:
                    top = held
            peak[c, r] = top
    return peak
