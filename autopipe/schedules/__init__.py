"""Pipeline schedules as data, one module per schedule, and the checks they pass.

``make_schedule("1f1b", devices=4, micro_batches=8)`` returns ``{rank: [Action, ...]}``,
already validated; ``schedule_spec("1f1b")`` is everything else about a schedule (where its
chunks run, its in-flight count, bubble, torch class). Names: ``gpipe``, ``1f1b``,
``interleaved-1f1b``, ``zb-h1``, ``zb-h2``, ``zb-v``, ``v-half``, ``v-min``, ``dualpipe-v`` (``registry.py``,
all searched; ``v_block.py`` builds the V-Half and V-Min lists).
"""

from __future__ import annotations

from autopipe.schedules.action import (
    Action,
    Kind,
    Placement,
    Schedule,
    format_schedule,
    has_split_backward,
    parse_schedule,
    round_robin,
    to_table,
)
from autopipe.schedules.registry import (
    SCHEDULES,
    SPECS,
    make_schedule,
    schedule_names,
    schedule_spec,
    search_order,
)
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.validate import validate

__all__ = [
    "SCHEDULES",
    "SPECS",
    "Action",
    "Kind",
    "Placement",
    "Schedule",
    "ScheduleSpec",
    "format_schedule",
    "has_split_backward",
    "make_schedule",
    "parse_schedule",
    "round_robin",
    "schedule_names",
    "schedule_spec",
    "search_order",
    "to_table",
    "validate",
]
