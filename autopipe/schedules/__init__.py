"""Pipeline schedules as data, one module per schedule, and the checks they pass.

``make_schedule("1f1b", stages=4, microbatches=8)`` returns ``{rank: [Action, ...]}``, already
validated. Names: ``gpipe``, ``1f1b``, ``interleaved-1f1b``, ``zb-h1``.
"""

from __future__ import annotations

from collections.abc import Callable

from autopipe.errors import ScheduleError
from autopipe.schedules import gpipe, interleaved, one_f_one_b, zb_h1
from autopipe.schedules.action import (
    Action,
    Schedule,
    format_schedule,
    has_split_backward,
    parse_schedule,
    rank_of,
    to_table,
)
from autopipe.schedules.validate import validate

__all__ = [
    "SCHEDULES",
    "Action",
    "Schedule",
    "format_schedule",
    "has_split_backward",
    "make_schedule",
    "parse_schedule",
    "rank_of",
    "to_table",
    "validate",
]

SCHEDULES: dict[str, Callable[[int, int, int], Schedule]] = {
    "gpipe": gpipe.create_schedule,
    "1f1b": one_f_one_b.create_schedule,
    "interleaved-1f1b": interleaved.create_schedule,
    "zb-h1": zb_h1.create_schedule,
}
"""name -> ``create_schedule(stages, microbatches, virtual)``."""


def make_schedule(name: str, stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The schedule ``name`` for ``stages`` ranks, ``microbatches`` and ``virtual`` chunks."""
    create = SCHEDULES.get(name)
    if create is None:
        raise ScheduleError(f"unknown schedule {name!r}; use one of {', '.join(SCHEDULES)}")
    schedule = create(stages, microbatches, virtual)
    validate(schedule, stages, microbatches, virtual)
    return schedule
