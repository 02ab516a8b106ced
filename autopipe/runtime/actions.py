"""What a plan says each rank does: its action lists, their predicted durations, its tied weights.

Tests: tests/runtime/test_engine.py.
"""

from __future__ import annotations

from collections.abc import Callable

from autopipe.plans import Plan
from autopipe.schedules import Action, Schedule, schedule_spec
from autopipe.stages.schedule_csv import plan_actions
from autopipe.stages.split import Split

__all__ = ["action_seconds", "plan_schedule", "shared_groups"]


def shared_groups(split: Split) -> list[tuple[str, tuple[int, ...]]]:
    """Shared parameters held by more than one rank, with those ranks (sorted)."""
    rank_of = {st.index: st.rank for st in split.stages}
    out = []
    for name, stages in split.shared_params:
        holders = tuple(sorted({rank_of[s] for s in stages}))
        if len(holders) > 1:
            out.append((name, holders))
    return out


def action_seconds(plan: Plan) -> Callable[[Action], float]:
    """The plan's predicted duration of an action (recomputation included); 1, 2, 1 for F, B,
    W when the plan has no predictions (made by hand, say)."""
    split = schedule_spec(plan.schedule).splits_backward
    stages = {st.index: st for st in plan.stages}
    predicted = any(st.forward_s > 0 for st in plan.stages)

    def seconds(a: Action) -> float:
        st = stages[a.stage]
        if not predicted:
            return 2.0 if a.kind == "B" else 1.0
        if a.kind == "F":
            return st.forward_s
        if a.kind == "W":
            return st.backward_weight_s
        return st.backward_input_s if split else st.backward_s

    return seconds


def plan_schedule(plan: Plan) -> Schedule:
    """The plan's action lists; PlanError if the plan puts a stage on another device than its
    schedule does (a plan edited by hand). The same lists as the schedule CSV's
    (:func:`~autopipe.stages.schedule_csv.plan_actions`)."""
    return plan_actions(plan)
