"""The one ``#`` line a framework's config gets for a plan made for another target.

A plan records the framework it was made for (``Plan.target``, ``autopipe plan --target``); made
for another (the free plan, ``--target autopipe``), it may hold a schedule or a recomputation the
framework does not run as priced. The config's own notes say what the framework runs instead
(megatron.py, torchtitan.py); this line says why and how to get a plan it runs as planned.

Tests: tests/config/test_retarget.py.
"""

from __future__ import annotations

from autopipe.plans import Plan
from autopipe.schedules.targets import target_spec

__all__ = ["retarget_notes"]


def retarget_notes(plan: Plan, target: str) -> list[str]:
    """``[]``, or one note where ``plan`` (made for another target) holds what ``target`` does not run as priced."""
    spec = target_spec(target)
    recompute = [s.recompute for s in plan.stages]
    if plan.target == target or spec.runs(plan.schedule, recompute):
        return []
    uneven = any(recompute) and not all(recompute)
    what = []
    if plan.schedule not in spec.schedules:
        what.append(f"its {plan.schedule} schedule")
    elif any(recompute) and plan.schedule not in spec.recomputing():
        what.append(f"its {plan.schedule} schedule with recomputation")
    if spec.uniform_recompute and uneven:
        what.append("recomputation on some stages only")
    return [
        f"the plan was made with --target {plan.target}: {spec.label} does not run {' or '.join(what)} as priced "
        f"(what it runs instead: above); 'autopipe plan ... --target {target}' plans the best {spec.label} runs "
        f"({spec.searched()})"
    ]
