"""Check that a schedule is complete, well placed, ordered, and free of deadlock.

:func:`validate` raises :class:`~autopipe.errors.ScheduleError` whose message is a one-line
summary of the first problem (``rank 1 step 3: 1B0 runs before 1F0``) followed by the whole
grid with the offending step marked ``>1B0<``. The checks, in order:

1. sizes: ``devices, micro_batches, virtual >= 1``; every rank key in ``[0, S)``;
2. each action names a stage (chunk) in ``[0, S*v)`` and a micro-batch in ``[0, m)``, and
   sits on the rank the schedule's placement gives its stage (default ``stage % S``); no
   action appears twice;
3. every (stage, micro-batch) has one F and one B; W for all of them or for none;
4. on its rank, F runs before B before W of the same (stage, micro-batch);
5. no deadlock: running every rank's list in order under the data dependencies of
   :mod:`autopipe.schedules.deps` finishes.
"""

from __future__ import annotations

from autopipe.errors import ScheduleError
from autopipe.schedules.action import (
    Action,
    Kind,
    Placement,
    Schedule,
    format_schedule,
    round_robin,
)
from autopipe.schedules.deps import execute_in_order

__all__ = ["check_sizes", "validate"]


def check_sizes(devices: int, micro_batches: int, virtual: int = 1) -> None:
    """Raise ScheduleError unless all three sizes are positive integers."""
    sizes = (("devices", devices), ("micro_batches", micro_batches), ("virtual", virtual))
    for name, value in sizes:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"{name} must be a positive integer (got {value!r})")


def _fail(schedule: Schedule, summary: str, mark: tuple[int, int] | None = None) -> ScheduleError:
    return ScheduleError(f"{summary}\n{format_schedule(schedule, mark)}")


def validate(
    schedule: Schedule,
    devices: int,
    micro_batches: int,
    virtual: int = 1,
    placement: Placement = round_robin,
) -> None:
    """Raise ScheduleError (summary line + marked grid) unless ``schedule`` is runnable on
    ``devices`` ranks with ``virtual`` chunks each, chunk ``j`` on ``placement(j, S, v)``."""
    check_sizes(devices, micro_batches, virtual)
    num_stages = devices * virtual
    for rank in schedule:
        if not 0 <= rank < devices:
            raise _fail(schedule, f"rank {rank} is outside 0..{devices - 1} (devices: {devices})")
    where = _places(schedule, devices, micro_batches, virtual, placement)
    _check_complete(schedule, where, num_stages, micro_batches)
    _check_order(schedule, where)
    stuck = execute_in_order(schedule, num_stages).stuck
    if stuck:
        detail = "; ".join(s.describe() for s in stuck)
        raise _fail(
            schedule,
            f"deadlock: no rank can run its next step ({detail})",
            (stuck[0].rank, stuck[0].step),
        )


def _places(
    schedule: Schedule, devices: int, micro_batches: int, virtual: int, placement: Placement
) -> dict[Action, tuple[int, int]]:
    """Check 2: each action's stage, micro-batch and rank; where each runs (rank, step)."""
    num_stages = devices * virtual
    where: dict[Action, tuple[int, int]] = {}
    for rank in sorted(schedule):
        for step, action in enumerate(schedule[rank]):
            if action is None:
                continue
            here = f"rank {rank} step {step}: {action}"
            if action.stage >= num_stages:
                raise _fail(
                    schedule,
                    f"{here} names stage {action.stage}, but there are {num_stages} virtual "
                    f"stages (devices: {devices}, virtual: {virtual})",
                    (rank, step),
                )
            if action.microbatch >= micro_batches:
                raise _fail(
                    schedule,
                    f"{here} names micro-batch {action.microbatch}, outside "
                    f"0..{micro_batches - 1} (micro_batches: {micro_batches})",
                    (rank, step),
                )
            home = placement(action.stage, devices, virtual)
            if home != rank:
                raise _fail(
                    schedule,
                    f"{here} belongs on rank {home} (the schedule's place for stage "
                    f"{action.stage} on {devices} devices)",
                    (rank, step),
                )
            if action in where:
                first = where[action]
                raise _fail(
                    schedule,
                    f"{here} appears twice (first at rank {first[0]} step {first[1]})",
                    (rank, step),
                )
            where[action] = (rank, step)
    return where


def _check_complete(
    schedule: Schedule, where: dict[Action, tuple[int, int]], num_stages: int, micro_batches: int
) -> None:
    """Check 3: one F and one B per (stage, micro-batch); W for all of them or for none."""
    split = any(a.kind is Kind.WEIGHT for a in where)
    kinds = tuple(Kind) if split else (Kind.FORWARD, Kind.BACKWARD)
    for stage in range(num_stages):
        for mb in range(micro_batches):
            for kind in kinds:
                if Action(stage, kind, mb) not in where:
                    why = (
                        "a schedule with W actions needs one W per (stage, micro-batch)"
                        if kind is Kind.WEIGHT
                        else "every (stage, micro-batch) needs one F and one B"
                    )
                    raise _fail(schedule, f"{stage}{kind}{mb} is missing: {why}")


def _check_order(schedule: Schedule, where: dict[Action, tuple[int, int]]) -> None:
    """Check 4: on its rank, F runs before B before W of the same (stage, micro-batch)."""
    for action, (rank, step) in sorted(where.items(), key=lambda item: item[1]):
        before = {Kind.BACKWARD: Kind.FORWARD, Kind.WEIGHT: Kind.BACKWARD}.get(action.kind)
        if before is None:
            continue
        other = Action(action.stage, before, action.microbatch)
        if where[other] > (rank, step):
            raise _fail(schedule, f"rank {rank} step {step}: {action} runs before {other}", (rank, step))
