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

__all__ = ["KIND_CODES", "B", "F", "RankLists", "W", "from_schedule", "rank_array", "to_schedule"]

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


def to_schedule(lists: RankLists) -> Schedule:
    """:data:`RankLists` as a Schedule of Action objects (the inverse of :func:`from_schedule`)."""
    return {
        r: [Action(int(s), _KINDS[int(k)], int(mb)) for s, k, mb in rows.tolist()]
        for r, rows in enumerate(lists)
    }
