"""The schedules autopipe knows, by name: one line per schedule module.

Adding a schedule is one new module in ``autopipe/schedules/`` that defines ``SPEC`` (a
:class:`~autopipe.schedules.spec.ScheduleSpec` next to its ``create_schedule``), its test, and
one line in :data:`SPECS`. The CLI's ``--schedule`` choices, the planner's search and every
other step read the schedules from here.
"""

from __future__ import annotations

from collections.abc import Callable

from autopipe.errors import ScheduleError
from autopipe.schedules import gpipe, interleaved, one_f_one_b, zb_h1, zb_h2
from autopipe.schedules.action import Schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.v_shapes import dualpipe_v, v_half, v_min, zb_v

__all__ = ["SCHEDULES", "SPECS", "make_schedule", "schedule_names", "schedule_spec", "search_order"]

SPECS: tuple[ScheduleSpec, ...] = (
    gpipe.SPEC,
    one_f_one_b.SPEC,
    interleaved.SPEC,
    zb_h1.SPEC,
    zb_h2.SPEC,
    zb_v.SPEC,
    v_half.SPEC,
    v_min.SPEC,
    dualpipe_v.SPEC,
)
"""Every schedule, in the order the CLI and error messages list them."""

_BY_NAME = {spec.name: spec for spec in SPECS}

SCHEDULES: dict[str, Callable[[int, int, int], Schedule]] = {spec.name: spec.create_schedule for spec in SPECS}
"""name -> ``create_schedule(devices, micro_batches, virtual)`` (unvalidated)."""


def schedule_names() -> tuple[str, ...]:
    """The ``--schedule`` names, in :data:`SPECS` order."""
    return tuple(_BY_NAME)


def schedule_spec(name: str) -> ScheduleSpec:
    """The spec of schedule ``name``; ScheduleError (one line) for an unknown name."""
    spec = _BY_NAME.get(name)
    if spec is None:
        raise ScheduleError(f"unknown schedule {name!r}; use one of {', '.join(_BY_NAME)}")
    return spec


def search_order() -> tuple[ScheduleSpec, ...]:
    """Every schedule, the one the search prefers among equally fast plans first (those with
    ``searched=False`` too: the search skips them unless the request pins one)."""
    return tuple(sorted(SPECS, key=lambda spec: spec.preference))


def make_schedule(name: str, devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
    """The validated schedule ``name`` for ``devices`` ranks, ``micro_batches`` and ``virtual``
    chunks per device."""
    return schedule_spec(name).make(devices, micro_batches, virtual)
