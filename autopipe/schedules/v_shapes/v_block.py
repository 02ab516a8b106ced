"""V-shape schedules from a building block, built as Qi et al. build them ("Pipeline
Parallelism with Controllable Memory", NeurIPS 2024, section 3 and appendix A; the authors'
generator is ``zbv_greedy.py`` in sail-sg/zero-bubble-pipeline-parallelism).

Device ``d`` of a V runs two chunks, ``down = d`` and ``up = 2S-1-d``
(:func:`~autopipe.schedules.action.v_shape`). A *building block* gives, per device, the slot
of micro-batch 0's four passes — ``F`` down, ``F`` up, ``B`` up, ``B`` down (:data:`Pattern`)
— with every pass one slot and no two of a device in the same slot modulo 6. Then, as the
paper does:

1. **repeat**: micro-batch ``i`` runs the block ``6i`` slots later;
2. **squeeze and reorder**: each W goes in the first free slot after its B; in the warm-up
   (before device 0's first down-leg ``B``) and the cool-down (after the last forward of
   chunk 0) every pass, in slot order, moves to the earliest free slot its dependencies allow
   that does not raise the highest per-device memory (F to W) of the repeated schedule; then
   every pass runs as early as its device's order allows (unit passes, free links);
3. the same once more without the Ws (the cool-down only), the Ws put back into the free
   slots after their Bs (an up-leg W first), left over ones at the end.

Each device's list is its passes in slot order. The steady state is the block itself, six
passes every six slots with no idle slot; the warm-up and cool-down do not depend on ``m``.
:func:`build` runs the steps in C when the extension is built (``_vbuild.c``, loaded and
switched by :mod:`autopipe.native`: about 5-10 ms per ``m`` at ``S = 64``, 25-50 ms at
``S = 128``, one core; ``bench/bench_build.py --v``), else in Python here (the twin: the same integer operations in
the same order, the same lists, tests/schedules/v_shapes/test_v_block.py; 20-40x slower): the reorder
checks a move against the highest memory by updating the per-slot counts of what it changes
(no recount of the device), the Ws go back as a queue served in the free slots, the squeeze
runs all passes of one slot at once;
:func:`lists` runs them for ``m = 2S`` and ``2S+1`` once per block, which shows where one
more micro-batch's six passes go, and tiles them in with numpy for any larger ``m`` (tens of
nanoseconds per action; the same lists as running the steps for ``m``, checked in
tests/schedules/v_shapes/test_v_block.py). The authors' code was read, not run or copied. Fewer than ``2S`` micro-batches are refused
(:func:`check`): below it the reordered warm-up and cool-down overlap and the bubble has no
closed form (the authors' own search, ``v_auto_schedule.py``, pads to ``2S`` as well).
"""

from __future__ import annotations

import bisect
from functools import cache
from itertools import accumulate

import numpy as np
import numpy.typing as npt

from autopipe import native
from autopipe.errors import ScheduleError
from autopipe.schedules.lists import B, F, RankLists, W
from autopipe.schedules.validate import check_sizes

__all__ = ["PERIOD", "PER_DEVICE", "Pattern", "build", "check", "device_peak", "held", "inflight", "lists"]

PERIOD = 6  # slots of work per micro-batch on a device: F, B, W of two chunks
PER_DEVICE = 2  # at least 2S micro-batches
Pattern = tuple[tuple[int, int, int, int], ...]
"""Per device, micro-batch 0's slots of ``F`` down, ``F`` up, ``B`` up, ``B`` down."""
_C = native.load(native.V_BUILDER)  # None where not built: build runs the Python steps

# Passes by type: 0 F down, 1 F up, 2 B up, 3 B down, 4 W up, 5 W down (one W list in the
# reorder steps). Chain: F down the V (0, from device d-1), F up (1, from d+1), B up (2, from
# d-1), B down (3, from d+1); at the turn and at the loss a pass follows the previous type.
_KIND = (F, F, B, B, W, W)
_DOWN = (True, False, False, True, False, True)
Slots = list[list[list[int]]]  # [device][type][micro-batch] -> slot
_NEXT = np.array((0, 0, 1), dtype=np.int64)  # a row one micro-batch later


def check(name: str, devices: int, micro_batches: int, virtual: int) -> None:
    """Positive sizes, ``virtual == 2`` and ``m >= 2S``, or a one-line ScheduleError."""
    check_sizes(devices, micro_batches, virtual)
    if virtual != 2:
        raise ScheduleError(f"{name} runs two chunks per device in a V (got virtual: {virtual}); use virtual=2")
    least = PER_DEVICE * devices
    if micro_batches < least:
        raise ScheduleError(
            f"{name} needs at least 2 x devices = {least} micro-batches on {devices} devices "
            f"(got {micro_batches}); use micro_batches >= {least}"
        )


def _served(arrivals: npt.NDArray[np.int64], chances: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per slot, how many of a queue's items have been served (oldest first), given the
    running counts of items arrived and of chances to serve one."""
    return chances + np.minimum(0, np.minimum.accumulate(arrivals - chances))


def _with_w(dev: list[list[int]], split: bool) -> list[list[int]]:
    """The 4 pass lists of one device and its Ws: each in the first free slot after its B
    (up-leg Ws first when ``split``), the rest after the last pass."""
    code = np.full(max(max(lst) for lst in dev[:4] if lst) + 1, -1, dtype=np.int64)
    for t, lst in enumerate(dev[:4]):
        code[lst] = t
    backs = np.cumsum(code >= 2, dtype=np.int64)
    done = _served(backs, np.cumsum(code == -1, dtype=np.int64))  # a free slot runs a W when a B waits
    filled = np.diff(done, prepend=0) > 0
    end, left = len(code), int(backs[-1] - done[-1])
    if not split:
        return [*dev[:4], [*np.flatnonzero(filled).tolist(), *range(end, end + left)]]
    ups = np.cumsum(code == 2, dtype=np.int64)
    up_done = _served(ups, np.cumsum(filled, dtype=np.int64))  # up-leg Ws first in the filled slots
    up = filled & (np.diff(up_done, prepend=0) > 0)
    up_left = int(ups[-1] - up_done[-1])
    return [
        *dev[:4],
        [*np.flatnonzero(up).tolist(), *range(end, end + up_left)],
        [*np.flatnonzero(filled & ~up).tolist(), *range(end + up_left, end + left)],
    ]


def _in_order(res: Slots) -> npt.NDArray[np.int64]:
    """Every pass as a (slot, device, type, micro-batch) row, in slot order (ties: device, type)."""
    parts = [
        np.column_stack((lst, np.full(len(lst), d), np.full(len(lst), t), np.arange(len(lst))))
        for d, dev in enumerate(res)
        for t, lst in enumerate(dev)
        if lst
    ]
    rows = np.concatenate(parts).astype(np.int64)
    return rows[np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1], rows[:, 0]))]


def _squeeze(res: Slots) -> Slots:
    """Each pass as early as its device's order and its dependencies allow (unit passes):
    every pass one slot after the latest of what it waits for, all passes of one slot at once
    (what a pass waits for sits in an earlier slot)."""
    S = len(res)
    base, at = [], 0  # base[d][t]: flat id of (d, t, 0)
    for dev in res:
        base.append([at + sum(len(lst) for lst in dev[:t]) for t in range(len(dev))])
        at += sum(len(lst) for lst in dev)
    slot = np.fromiter((s for dev in res for lst in dev for s in lst), dtype=np.int64, count=at)
    pred = np.full((at + 1, 4), at, dtype=np.int64)  # row `at`: nothing (start -1)
    for d, dev in enumerate(res):
        for t, lst in enumerate(dev):
            ids = np.arange(base[d][t], base[d][t] + len(lst))
            pred[ids[1:], 0] = ids[:-1]
            if 0 < t < 4:
                pred[ids, 1] = np.arange(base[d][t - 1], base[d][t - 1] + len(lst))
            near = d - 1 if t in (0, 2) else d + 1 if t in (1, 3) else -1
            if 0 <= near < S:
                pred[ids, 2] = np.arange(base[near][t], base[near][t] + len(lst))
        ids = np.arange(base[d][0], base[d][0] + sum(len(lst) for lst in dev))
        ids = ids[np.argsort(slot[ids], kind="stable")]
        pred[ids[1:], 3] = ids[:-1]
    order = np.argsort(slot, kind="stable")
    cuts = np.flatnonzero(np.diff(slot[order])) + 1
    start = np.full(at + 1, -1, dtype=np.int64)
    for ids in np.split(order, cuts):
        start[ids] = start[pred[ids]].max(axis=1) + 1
    flat = start.tolist()
    return [[flat[base[d][t] : base[d][t] + len(lst)] for t, lst in enumerate(dev)] for d, dev in enumerate(res)]


Implicit = tuple[list[int], list[int], list[int]]
"""Per slot of a device whose Ws fill its free slots (code -1), oldest first: the activations
held, the free-slot shortfall (how far backwards less free slots has fallen below 0: a free
slot with no W to run), and backwards less free slots."""


def _implicit(code: npt.NDArray[np.int64]) -> Implicit:
    """:data:`Implicit` of a device's slots (code: pass type, -1 free)."""
    x = np.cumsum(code >= 2) - np.cumsum(code == -1)
    low = np.minimum(0, np.minimum.accumulate(x))
    held = np.cumsum((code == 0) | (code == 1)) - np.cumsum(code == -1) - low
    return held.tolist(), (-low).tolist(), x.tolist()


def _move(state: Implicit, t: int, p: int, s: int) -> None:
    """Update ``state`` in place for pass type ``t`` moved from slot ``s`` to free slot ``p``:
    in [p, s) one free slot fewer and one forward (or backward) more; from ``s`` on the counts
    are as before and the shortfall, never lower, as before from where it meets the old one."""
    held, rise, x = state
    fe, dx = (2, 1) if t <= 1 else (1, 2)  # forwards less free slots, backwards less free slots
    x[p:s] = [v + dx for v in x[p:s]]
    low = list(accumulate(x[p:s], min, initial=-rise[p - 1] if p else 0))[1:]
    held[p:s] = [h + fe - r - lo for h, r, lo in zip(held[p:s], rise[p:s], low, strict=True)]
    rise[p:s] = [-lo for lo in low]
    cur = low[-1]
    for i in range(s, len(x)):
        if x[i] < cur:
            cur = x[i]
        if cur == -rise[i]:
            break
        held[i] -= rise[i] + cur
        rise[i] = -cur


def _fits(state: Implicit, t: int, p: int, s: int, most: int) -> bool:
    """Whether moving pass type ``t`` (no Ws) from slot ``s`` to free slot ``p`` keeps the
    implicit peak at most ``most``: in [p, s) a forward adds one held activation, and one
    more up to the first slot whose shortfall grows past the one before ``p`` (that slot no
    longer idles, so one W fewer has run); a backward adds one there (its W runs one slot
    late); from ``s`` on nothing held grows."""
    held, rise = state[0], state[1]
    grows = min(s, bisect.bisect_right(rise, rise[p - 1] if p else 0))
    if t <= 1:
        return max(held[p:s]) < most and (grows == p or max(held[p:grows]) + 2 <= most)
    return grows == p or max(held[p:grows]) < most


def _reorder(res: Slots, with_w: bool, m: int) -> Slots:
    """One reorder step (see the module docstring); ``with_w``: the first, Ws placed."""
    if with_w:
        res = [_with_w(dev, split=False) for dev in res]
    res = [[list(lst) for lst in dev] for dev in res]
    S = len(res)
    size = [dev[-1][-1] + 1 for dev in res]
    code = [np.full(n, -1, dtype=np.int64) for n in size]
    for d, dev in enumerate(res):
        for t, lst in enumerate(dev):
            code[d][lst] = t
    if with_w:
        held_w = [np.cumsum((c <= 1) & (c >= 0)) - np.cumsum(c == 4) for c in code]
        most = max(int(h.max()) for h in held_w)
    else:
        state = [_implicit(c) for c in code]
        most = max(max(h[0]) for h in state)
    order = _in_order(res)  # kept in place: from device 0's first down-leg B (with_w; else
    # from the first pass) to the first forward down the V of the last micro-batch after it
    n = len(order)
    at = np.flatnonzero((order[:, 2] == 3) & (order[:, 1] == 0))
    turn = int(at[0]) if len(at) else n
    at = np.flatnonzero((order[turn:, 2] == 0) & (order[turn:, 3] == m - 1))
    last = turn + int(at[0]) if len(at) else n - 1
    kept = order[turn : last + 1] if with_w else order[: last + 1]
    grid = np.zeros((S, max(size)), dtype=np.uint8)
    grid[kept[:, 1], kept[:, 0]] = 1
    taken = [bytearray(grid[d, : size[d]].tobytes()) for d in range(S)]
    backs: list[list[int]] = [[] for _ in res]  # with_w: per device, placed B slots, sorted
    moved: list[list[int]] = (
        np.concatenate((order[:turn], order[last + 1 :])) if with_w else order[last + 1 :]
    ).tolist()
    kept_b = kept[(kept[:, 2] == 2) | (kept[:, 2] == 3)]  # in slot order
    for i, (s, d, t, k) in enumerate(moved):
        if with_w and i == turn:  # the kept Bs, after those of the warm-up
            for d2, b in zip(kept_b[:, 1].tolist(), kept_b[:, 0].tolist(), strict=True):
                backs[d2].append(b)
        mine = res[d]
        first = 0
        if t in (0, 2) and d > 0:
            first = res[d - 1][t][k] + 1
        elif t in (1, 3) and d + 1 < S:
            first = res[d + 1][t][k] + 1
        if 0 < t < 4 and mine[t - 1][k] >= first:
            first = mine[t - 1][k] + 1
        if k and mine[t][k - 1] >= first:
            first = mine[t][k - 1] + 1
        if t == 4 and backs[d][k] >= first:  # a W after the k-th backward of either chunk (all placed: slots < s)
            first = backs[d][k] + 1
        free = taken[d]
        to = s
        if with_w:
            if t <= 1 and first < s and held_w[d][first:s].max() >= most:
                first += int(np.flatnonzero(held_w[d][first:s] >= most)[-1]) + 1
            p = free.find(0, first, s) if first < s else -1
            if p >= 0:
                to = p
                if t <= 1 or t == 4:
                    held_w[d][to:s] += 1 if t <= 1 else -1
        else:
            p = free.find(0, first, s) if first < s else -1
            while p >= 0:
                if _fits(state[d], t, p, s, most):
                    to = p
                    _move(state[d], t, p, s)
                    break
                p = free.find(0, p + 1, s)
        mine[t][k] = to
        free[to] = 1
        if with_w and t in (2, 3):
            bisect.insort(backs[d], to)
    if not with_w:
        res = [_with_w(dev, split=False) for dev in res]
    return _squeeze(res)


def _rows(slots: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int64]]:
    """Each device's passes in slot order (ties: type, micro-batch) as (chunk, kind,
    micro-batch) rows, from the ``(S, 6, m)`` slots of :func:`build`."""
    S, types, m = slots.shape
    order = np.argsort(slots.reshape(S, types * m), axis=1, kind="stable")  # columns: (type, k)
    rows = np.empty((S, types * m, 3), dtype=np.int64)
    device = np.arange(S, dtype=np.int64)[:, None]
    rows[:, :, 0] = np.where(np.repeat(np.array(_DOWN), m)[order], device, 2 * S - 1 - device)
    rows[:, :, 1] = np.repeat(np.array(_KIND, dtype=np.int64), m)[order]
    rows[:, :, 2] = order % m
    return list(rows)


def _in_c(pattern: npt.NDArray[np.int64], micro_batches: int) -> npt.NDArray[np.int64] | None:
    """:func:`build`'s slots in C (``_vbuild.c``): ``(S, 6, m)``, per device its F down, F up,
    B up, B down, up-leg W and down-leg W slots, each in micro-batch order, for ``pattern``
    (``(S, 4)``: micro-batch 0's slots) repeated ``micro_batches`` times; None when the C
    extension is not built or switched off (:mod:`autopipe.native`)."""
    if _C is None or not native.enabled():
        return None
    pat = np.ascontiguousarray(pattern, dtype=np.int64)
    out = np.empty((len(pat), 6, micro_batches), dtype=np.int64)
    _C.build(pat, len(pat), micro_batches, out)
    return out


def build(pattern: Pattern, micro_batches: int) -> list[npt.NDArray[np.int64]]:
    """The lists of ``pattern`` repeated ``micro_batches`` times, squeezed and reordered (the
    steps of the module docstring, run in full: in C when built, :func:`_in_c`; else the
    Python steps here, the same integer operations)."""
    slots = _in_c(np.array(pattern, dtype=np.int64).reshape(-1, 4), micro_batches)
    if slots is None:
        repeated = [[list(range(x, x + PERIOD * micro_batches, PERIOD)) for x in dev] for dev in pattern]
        first = _reorder(repeated, True, micro_batches)
        second = _reorder([dev[:4] for dev in first], False, micro_batches)
        slots = np.array([_with_w(dev[:4], split=True) for dev in second], dtype=np.int64)
    return _rows(slots)


@cache
def _built(pattern: Pattern, micro_batches: int) -> tuple[npt.NDArray[np.int64], ...]:
    """:func:`build`, kept (read-only arrays)."""
    out = build(pattern, micro_batches)
    for rows in out:
        rows.setflags(write=False)
    return tuple(out)


@cache
def _steady(pattern: Pattern) -> tuple[tuple[npt.NDArray[np.int64], int, npt.NDArray[np.int64]], ...] | None:
    """Per device: the ``m = 2S`` lists, where one more micro-batch adds its 6 passes, and
    those 6 passes (read off the ``m = 2S+1`` lists, whose rest is the ``2S`` lists one
    micro-batch later); None if some device's lists do not grow that way."""
    least = PER_DEVICE * len(pattern)
    out = []
    for rows, more in zip(_built(pattern, least), _built(pattern, least + 1), strict=True):
        differ = np.flatnonzero(np.any(rows != more[: len(rows)], axis=1))
        at = int(differ[0]) if len(differ) else len(rows)
        if not np.array_equal(more[at + PERIOD :], rows[at:] + _NEXT):
            return None
        out.append((rows, at, more[at : at + PERIOD]))
    return tuple(out)


def lists(pattern: Pattern, micro_batches: int) -> RankLists:
    """:func:`build`'s lists for ``micro_batches >= 2S``: the ``m = 2S`` lists with the 6
    passes of each further micro-batch tiled in where the steady state repeats (numpy; no
    per-action Python; equal to :func:`build`'s, tests/schedules/v_shapes/test_v_block.py)."""
    extra = micro_batches - PER_DEVICE * len(pattern)
    steady = _steady(pattern)
    if extra <= 0 or steady is None:  # pragma: no cover - no S up to 64 needs it
        return tuple(rows.copy() for rows in _built(pattern, micro_batches))
    out = []
    for rows, at, period in steady:
        tiled = np.tile(period, (extra, 1))
        tiled[:, 2] += np.repeat(np.arange(extra, dtype=np.int64), PERIOD)
        tail = rows[at:].copy()
        tail[:, 2] += extra
        out.append(np.concatenate((rows[:at], tiled, tail)))
    return tuple(out)


def inflight(rank_lists: RankLists, devices: int) -> tuple[float, ...]:
    """Per chunk, the micro-batches whose activations it holds (F run, W not yet) when its
    device holds the most: the two chunks of a device sum to that most (their own peaks come
    at different times, and their sum would overstate the device's)."""
    held = np.zeros(2 * devices)
    for rows in rank_lists:
        if not len(rows):
            continue
        step = (rows[:, 1] == F).astype(np.int64) - (rows[:, 1] == W)  # the device's count moves
        at = int(np.argmax(np.cumsum(step)))  # first slot of the most
        mine = np.bincount(rows[:, 0], minlength=2 * devices) > 0
        held[mine] = np.bincount(rows[: at + 1, 0], weights=step[: at + 1], minlength=2 * devices)[mine]
    return tuple(held.tolist())


def held(pattern: Pattern, micro_batches: int) -> tuple[float, ...]:
    """:func:`inflight` of :func:`lists` (``micro_batches >= 2S``), kept: the same for every
    ``m >= 2S+1`` where the steady state tiles, so read off the ``2S+1`` lists. Each tiled
    period runs one F and one W of each chunk of its device, so every chunk's count repeats
    period by period: the counts along a device's list are the ``2S+1`` ones with that
    period's counts repeated, the most held and the first slot it is reached at included."""
    least = PER_DEVICE * len(pattern) + 1
    return _held(pattern, min(micro_batches, least) if _steady(pattern) is not None else micro_batches)


@cache
def _held(pattern: Pattern, micro_batches: int) -> tuple[float, ...]:
    return inflight(lists(pattern, micro_batches), len(pattern))


def device_peak(rank_lists: RankLists) -> tuple[int, ...]:
    """Per device, the most chunk activations held at once: F run, its W not yet."""
    return tuple(int((np.cumsum(r[:, 1] == F) - np.cumsum(r[:, 1] == W)).max()) for r in rank_lists)
