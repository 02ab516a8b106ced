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
:func:`build` runs the steps (plain Python, about 1.5 s per ``m`` at ``S = 64``);
:func:`lists` runs them for ``m = 2S`` and ``2S+1`` once per block, which shows where one
more micro-batch's six passes go, and tiles them in with numpy for any larger ``m`` (tens of
nanoseconds per action; the same lists as running the steps for ``m``, checked in
tests/schedules/test_v_block.py). The authors' code was read, not run or copied. Fewer than ``2S`` micro-batches are refused
(:func:`check`): below it the reordered warm-up and cool-down overlap and the bubble has no
closed form (the authors' own search, ``v_auto_schedule.py``, pads to ``2S`` as well).
"""

from __future__ import annotations

import bisect
from functools import cache

import numpy as np
import numpy.typing as npt

from autopipe.errors import ScheduleError
from autopipe.schedules.lists import B, F, RankLists, W
from autopipe.schedules.validate import check_sizes

__all__ = ["PERIOD", "PER_DEVICE", "Pattern", "build", "check", "device_peak", "inflight", "lists"]

PERIOD = 6  # slots of work per micro-batch on a device: F, B, W of two chunks
PER_DEVICE = 2  # at least 2S micro-batches
Pattern = tuple[tuple[int, int, int, int], ...]
"""Per device, micro-batch 0's slots of ``F`` down, ``F`` up, ``B`` up, ``B`` down."""

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


def _with_w(dev: list[list[int]], split: bool) -> list[list[int]]:
    """The 4 pass lists of one device and its Ws: each in the first free slot after its B
    (up-leg Ws first when ``split``), the rest after the last pass."""
    kind = {s: t for t, lst in enumerate(dev[:4]) for s in lst}
    pending, ws = [0, 0], [[], []]  # type: ignore[var-annotated]
    last = max(kind)
    for i in range(last + 1):
        t = kind.get(i)
        if t is not None:
            if t >= 2:
                pending[t - 2 if split else 0] += 1
            continue
        w = 0 if pending[0] else 1 if pending[1] else -1
        if w >= 0:
            ws[w].append(i)
            pending[w] -= 1
    for w in (0, 1):
        for _ in range(pending[w]):
            last += 1
            ws[w].append(last)
    return [*dev[:4], ws[0], ws[1]] if split else [*dev[:4], ws[0]]


def _in_order(res: Slots) -> list[list[int]]:
    """Every pass as [slot, device, type, micro-batch], in slot order (ties: device, type)."""
    parts = [
        np.column_stack((lst, np.full(len(lst), d), np.full(len(lst), t), np.arange(len(lst))))
        for d, dev in enumerate(res)
        for t, lst in enumerate(dev)
        if lst
    ]
    rows = np.concatenate(parts).astype(np.int64)
    order = np.lexsort((rows[:, 3], rows[:, 2], rows[:, 1], rows[:, 0]))
    out: list[list[int]] = rows[order].tolist()
    return out


def _deps(res: Slots, d: int, t: int, k: int) -> list[int]:
    """The slots of what pass (d, t, k) waits for (its chain, the previous micro-batch)."""
    out = []
    if t in (0, 2) and d > 0:
        out.append(res[d - 1][t][k])
    if t in (1, 3) and d + 1 < len(res):
        out.append(res[d + 1][t][k])
    if 0 < t < 4:
        out.append(res[d][t - 1][k])
    if k:
        out.append(res[d][t][k - 1])
    return out


def _squeeze(res: Slots) -> Slots:
    """Each pass as early as its device's order and its dependencies allow (unit passes)."""
    S, free = len(res), [0] * len(res)
    out: Slots = [[[0] * len(lst) for lst in dev] for dev in res]
    for _, d, t, k in _in_order(res):
        mine, start = out[d], free[d]
        if k:
            start = max(start, mine[t][k - 1] + 1)
        if 0 < t < 4:
            start = max(start, mine[t - 1][k] + 1)
        if t in (0, 2) and d > 0:
            start = max(start, out[d - 1][t][k] + 1)
        elif t in (1, 3) and d + 1 < S:
            start = max(start, out[d + 1][t][k] + 1)
        mine[t][k] = start
        free[d] = start + 1
    return out


def _peak_implicit(code: npt.NDArray[np.int64]) -> int:
    """Most activations held on a device whose Ws fill its free slots (code -1), oldest first."""
    forwards = np.cumsum((code == 0) | (code == 1))
    backs = np.cumsum((code == 2) | (code == 3))
    empty = np.cumsum(code == -1)
    done = empty + np.minimum(0, np.minimum.accumulate(backs - empty))
    return int((forwards - done).max())


def _reorder(res: Slots, with_w: bool, m: int) -> Slots:
    """One reorder step (see the module docstring); ``with_w``: the first, Ws placed."""
    if with_w:
        res = [_with_w(dev, split=False) for dev in res]
    res = [[list(lst) for lst in dev] for dev in res]
    size = [dev[-1][-1] + 1 for dev in res]
    taken = [bytearray(n) for n in size]
    code = [np.full(n, -1, dtype=np.int64) for n in size]
    held = []  # with_w: per device, activations held after each slot
    for d, dev in enumerate(res):
        for t, lst in enumerate(dev):
            code[d][lst] = t
        held.append(np.cumsum((code[d] <= 1) & (code[d] >= 0)) - np.cumsum(code[d] == 4))
    most = max(int(h.max()) for h in held) if with_w else max(_peak_implicit(c) for c in code)
    backs: list[list[int]] = [[] for _ in res]  # with_w: per device, placed B slots, sorted
    phase = 0
    for s, d, t, k in _in_order(res):
        if t == 3 and d == 0 and phase == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_w):
            if phase == 1 and t == 0 and k == m - 1:
                phase = 2
            taken[d][s] = 1
            if t in (2, 3):
                bisect.insort(backs[d], s)
            continue
        first = max(_deps(res, d, t, k), default=-1) + 1
        if t == 4:  # a W after the k-th backward of either chunk (all placed: slots < s)
            first = max(first, backs[d][k] + 1)
        to = s
        for p in range(first, s):
            if taken[d][p]:
                continue
            if with_w:
                if t > 1 or int(held[d][p:s].max()) < most:
                    to = p
                    break
            else:
                code[d][s], code[d][p] = -1, t
                if _peak_implicit(code[d]) <= most:
                    to = p
                    break
                code[d][p], code[d][s] = -1, t
        if with_w and to < s:
            held[d][to:s] += 1 if t <= 1 else -1 if t == 4 else 0
        res[d][t][k] = to
        taken[d][to] = 1
        if t in (2, 3):
            bisect.insort(backs[d], to)
    if not with_w:
        res = [_with_w(dev, split=False) for dev in res]
    return _squeeze(res)


def _rows(res: Slots) -> list[npt.NDArray[np.int64]]:
    """Each device's passes in slot order as (chunk, kind, micro-batch) rows."""
    S, out = len(res), []
    for d, dev in enumerate(res):
        items = sorted((s, t, k) for t, lst in enumerate(dev) for k, s in enumerate(lst))
        out.append(np.array([(d if _DOWN[t] else 2 * S - 1 - d, _KIND[t], k) for _, t, k in items], dtype=np.int64).reshape(-1, 3))
    return out


def build(pattern: Pattern, micro_batches: int) -> list[npt.NDArray[np.int64]]:
    """The lists of ``pattern`` repeated ``micro_batches`` times, squeezed and reordered (the
    steps of the module docstring, run in full)."""
    repeated = [[list(range(x, x + PERIOD * micro_batches, PERIOD)) for x in dev] for dev in pattern]
    first = _reorder(repeated, True, micro_batches)
    second = _reorder([dev[:4] for dev in first], False, micro_batches)
    return _rows([_with_w(dev[:4], split=True) for dev in second])


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
    per-action Python; equal to :func:`build`'s, tests/schedules/test_v_block.py)."""
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
    held = [0.0] * (2 * devices)
    for rows in rank_lists:
        chunks = np.unique(rows[:, 0])
        counts = [np.cumsum((rows[:, 0] == c) & (rows[:, 1] == F)) - np.cumsum((rows[:, 0] == c) & (rows[:, 1] == W)) for c in chunks]
        at = int(np.argmax(np.sum(counts, axis=0)))
        for c, count in zip(chunks, counts, strict=True):
            held[int(c)] = float(count[at])
    return tuple(held)


def device_peak(rank_lists: RankLists) -> tuple[int, ...]:
    """Per device, the most chunk activations held at once: F run, its W not yet."""
    return tuple(int((np.cumsum(r[:, 1] == F) - np.cumsum(r[:, 1] == W)).max()) for r in rank_lists)
