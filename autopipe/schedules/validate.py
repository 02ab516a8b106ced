"""Check that a schedule is complete, well placed, ordered, and free of deadlock.

:func:`validate` raises :class:`~autopipe.errors.ScheduleError` whose message is a one-line
summary of the first problem (``rank 1 step 3: 1B0 runs before 1F0``) followed by the whole
grid with the offending step marked ``>1B0<``. The checks, in order:

1. sizes: ``stages, microbatches, virtual >= 1``; every rank key in ``[0, S)``;
2. each action names a stage in ``[0, S*v)`` and a micro-batch in ``[0, m)``, and sits on
   rank ``stage % S``; no action appears twice;
3. every (stage, micro-batch) has one F and one B; W for all of them or for none;
4. on its rank, F runs before B before W of the same (stage, micro-batch);
5. no deadlock: running every rank's list in order under the data dependencies of
   :mod:`autopipe.schedules.deps` finishes.
"""

from __future__ import annotations

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Schedule, format_schedule
from autopipe.schedules.deps import execute_in_order

__all__ = ["check_sizes", "validate"]


def check_sizes(stages: int, microbatches: int, virtual: int = 1) -> None:
    """Raise ScheduleError unless all three sizes are positive integers."""
    for name, value in (("stages", stages), ("microbatches", microbatches), ("virtual", virtual)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"{name} must be a positive integer (got {value!r})")


def _fail(schedule: Schedule, summary: str, mark: tuple[int, int] | None = None) -> ScheduleError:
    return ScheduleError(f"{summary}\n{format_schedule(schedule, mark)}")


def validate(schedule: Schedule, stages: int, microbatches: int, virtual: int = 1) -> None:
    """Raise ScheduleError (summary line + marked grid) unless ``schedule`` is runnable."""
    check_sizes(stages, microbatches, virtual)
    num_stages = stages * virtual
    for rank in schedule:
        if not 0 <= rank < stages:
            raise _fail(schedule, f"rank {rank} is outside 0..{stages - 1} (stages: {stages})")

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
                    f"stages (stages: {stages}, virtual: {virtual})",
                    (rank, step),
                )
            if action.microbatch >= microbatches:
                raise _fail(
                    schedule,
                    f"{here} names micro-batch {action.microbatch}, outside "
                    f"0..{microbatches - 1} (microbatches: {microbatches})",
                    (rank, step),
                )
            if action.stage % stages != rank:
                raise _fail(
                    schedule,
                    f"{here} belongs on rank {action.stage % stages} "
                    f"(stage {action.stage} % {stages} stages)",
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

    split = any(a.kind == "W" for a in where)
    kinds = ("F", "B", "W") if split else ("F", "B")
    for stage in range(num_stages):
        for mb in range(microbatches):
            for kind in kinds:
                if Action(stage, kind, mb) not in where:
                    why = (
                        "a schedule with W actions needs one W per (stage, micro-batch)"
                        if kind == "W"
                        else "every (stage, micro-batch) needs one F and one B"
                    )
                    raise _fail(schedule, f"{stage}{kind}{mb} is missing: {why}")

    for action, (rank, step) in sorted(where.items(), key=lambda item: item[1]):
        before = {"B": "F", "W": "B"}.get(action.kind)
        if before is None:
            continue
        other = Action(action.stage, before, action.microbatch)
        if where[other] > (rank, step):
            raise _fail(
                schedule, f"rank {rank} step {step}: {action} runs before {other}", (rank, step)
            )

    stuck = execute_in_order(schedule, num_stages).stuck
    if stuck:
        detail = "; ".join(s.describe() for s in stuck)
        raise _fail(
            schedule,
            f"deadlock: no rank can run its next step ({detail})",
            (stuck[0].rank, stuck[0].step),
        )
