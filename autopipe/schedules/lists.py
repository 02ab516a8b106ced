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
    "numbered",
    "rank_array",
    "repeated",
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
    out = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    return out


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
    return {
        r: [Action(s, _KINDS[k], mb) for s, k, mb in rows.tolist()] for r, rows in enumerate(lists)
    }


def repeated(*parts: tuple[tuple[int, ...], int]) -> npt.NDArray[np.int64]:
    """The codes of ``parts`` in order, each ``(pattern, times)`` its pattern ``times`` times
    (none when ``times <= 0``): how the generators write a rank's list, a segment at a time."""
    tiles = [np.tile(np.asarray(p, dtype=np.int64), max(0, n)) for p, n in parts]
    return np.concatenate(tiles) if tiles else np.zeros(0, dtype=np.int64)


def numbered(codes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """One rank's ``(n, 3)`` array from its actions in run order given as codes
    ``3 * stage + kind``, each (stage, kind) taking micro-batches ``0, 1, 2, ...`` in that order
    (true of every schedule here: a chunk runs its forwards, backwards and weight-grads each in
    micro-batch order)."""
    out = np.empty((len(codes), 3), dtype=np.int64)
    out[:, 0], out[:, 1] = np.divmod(codes, 3)
    for code in np.flatnonzero(np.bincount(codes)):
        at = codes == code
        out[at, 2] = np.arange(np.count_nonzero(at))
    return out
