"""A schedule as integer arrays: the form the planner builds, compiles and simulates.

:data:`~autopipe.schedules.action.Schedule` (``{rank: [Action, ...]}``) is for people, the
executor and the exporters. The planner prices the same schedules at 64 devices x 1,536
micro-batches — 300,000 actions — many times per plan, where one Python object per action is
most of the cost. :data:`RankLists` holds the same lists as integers: per rank, one row per
action, columns ``(stage, kind, micro-batch)`` with ``kind`` 0 for F, 1 for B, 2 for W, in the
order the rank runs them (no idle slots). :func:`to_schedule` and :func:`from_schedule` convert
exactly, both ways.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Kind, Schedule

__all__ = [
    "KIND_CODES",
    "B",
    "F",
    "RankLists",
    "W",
    "from_schedule",
    "placed",
    "rank_array",
    "tiled",
    "to_actions",
    "to_schedule",
]

F, B, W = 0, 1, 2
KIND_CODES: dict[Kind, int] = {Kind.FORWARD: F, Kind.BACKWARD: B, Kind.WEIGHT: W}
_KINDS = (Kind.FORWARD, Kind.BACKWARD, Kind.WEIGHT)

RankLists = tuple[npt.NDArray[np.int64], ...]
"""Per rank ``0 .. S-1``: an ``(n_r, 3)`` int64 array of ``(stage, kind, micro-batch)`` rows."""


def rank_array(rows: object) -> npt.NDArray[np.int64]:
    """``rows`` (a sequence of ``(stage, kind, micro-batch)`` triples, or an array) as one rank's
    ``(n, 3)`` int64 array; an empty sequence gives shape ``(0, 3)``."""
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def from_schedule(schedule: Schedule, devices: int) -> RankLists:
    """``schedule`` as :data:`RankLists` for ranks ``0 .. devices-1`` (idle slots dropped); a
    rank outside that range is a ScheduleError."""
    extra = sorted(r for r in schedule if not 0 <= r < devices)
    if extra:
        raise ScheduleError(f"schedule has rank {extra[0]}, but only ranks 0..{devices - 1} exist")
    return tuple(
        rank_array([(a.stage, KIND_CODES[a.kind], a.microbatch) for a in schedule.get(r, []) if a is not None])
        for r in range(devices)
    )


def to_actions(rows: npt.NDArray[np.int64]) -> list[Action]:
    """One rank's ``(n, 3)`` array as its list of Actions."""
    return [Action(s, _KINDS[k], mb) for s, k, mb in rows.tolist()]


def to_schedule(lists: RankLists) -> Schedule:
    """:data:`RankLists` as a Schedule of Action objects (the inverse of :func:`from_schedule`)."""
    return {r: [Action(s, _KINDS[k], mb) for s, k, mb in rows.tolist()] for r, rows in enumerate(lists)}


_Run = tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


def placed(ranks: int, length: int, *runs: _Run) -> RankLists:
    """The lists of ``ranks`` ranks of ``length`` actions each, from where every action runs:
    each run ``(kind, stage, position, micro-batch)``, the last three arrays broadcast to
    ``(ranks, n)`` (row ``r`` for rank ``r``), every position of every rank filled once. For
    schedules whose positions have a closed form: all ranks in a few numpy operations."""
    rows = np.empty((ranks, length, 3), dtype=np.int64)
    rank = np.arange(ranks)[:, None]
    for kind, stage, position, micro_batch in runs:
        rows[rank, position, 0] = stage
        rows[rank, position, 1] = kind
        rows[rank, position, 2] = micro_batch
    return tuple(rows)


def tiled(*parts: tuple[Sequence[int] | npt.NDArray[np.int64], int]) -> npt.NDArray[np.int64]:
    """One rank's ``(n, 3)`` array from its actions in run order, written a segment at a time:
    each part ``(pattern, times)`` runs ``pattern`` (codes ``3 * stage + kind``) ``times`` times
    (none when ``times <= 0``). Each (stage, kind) takes micro-batches ``0, 1, 2, ...`` in run
    order (true of every schedule here: a chunk runs its forwards, backwards and weight-grads
    each in micro-batch order), so a segment's micro-batches are its first round's plus, per
    round, how often the code occurs in the pattern: no work per action outside numpy."""
    done: dict[int, int] = {}  # actions of each code in the parts before
    all_codes, all_mbs = [], []
    for pattern, times in parts:
        if times <= 0 or not len(pattern):
            continue
        codes = np.asarray(pattern, dtype=np.int64)
        first, per = _first_round(codes, done)
        mbs = first + np.arange(times, dtype=np.int64)[:, None] * per  # (times, len(pattern))
        tiles = np.empty_like(mbs)
        tiles[:] = codes
        all_codes.append(tiles.reshape(-1))
        all_mbs.append(mbs.reshape(-1))
        done.update(zip(codes.tolist(), (mbs[-1] + 1).tolist(), strict=True))  # last one counts
    if not all_codes:
        return np.zeros((0, 3), dtype=np.int64)
    codes = np.concatenate(all_codes)
    out = np.empty((len(codes), 3), dtype=np.int64)
    out[:, 0] = codes // 3
    out[:, 1] = codes - 3 * out[:, 0]
    out[:, 2] = np.concatenate(all_mbs)
    return out


def _first_round(
    codes: npt.NDArray[np.int64], done: dict[int, int]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per position of ``codes``, its micro-batch in the first round (after ``done``) and how
    often its code occurs in ``codes`` (the step per round)."""
    first = np.empty(len(codes), dtype=np.int64)
    per = np.empty(len(codes), dtype=np.int64)
    if len(codes) <= 16:  # a pattern: plain ints
        seen: dict[int, int] = {}
        for i, code in enumerate(codes.tolist()):
            first[i] = done.get(code, 0) + seen.get(code, 0)
            seen[code] = seen.get(code, 0) + 1
        per[:] = [seen[c] for c in codes.tolist()]
        return first, per
    for code in np.unique(codes).tolist():  # a long list run once: a mask per code
        at = codes == code
        n = int(np.count_nonzero(at))
        first[at] = done.get(code, 0) + np.arange(n)
        per[at] = n
    return first, per
