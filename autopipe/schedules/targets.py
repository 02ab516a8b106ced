"""The frameworks a plan is made for (``autopipe plan --target``) and what of the search each runs as priced.

Megatron-LM runs 1F1B and interleaved 1F1B (config/megatron.py) with full recomputation on every
stage or none; torchtitan the schedules torch has a class for (config/torchtitan.py), its
activation checkpointing one mode for all stages; ``to_torch_pipelining`` (stages/export.py) every
schedule, those without a class as a schedule CSV; autopipe's executor everything. The planner
keeps its search to a target's (planner/request.py, planner/search.py); a plan records the target
it was made for (``Plan.target``), and ``autopipe config`` says when a plan made for another target
holds what the framework does not run (config/retarget.py).

Tests: tests/schedules/test_targets.py (and tests/planner/test_target_modes.py, every planning mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autopipe.errors import PlanError
from autopipe.schedules.registry import schedule_names, search_order

__all__ = ["TARGETS", "Target", "target_spec"]


@dataclass(frozen=True)
class Target:
    """A framework that will run the plan, and what of the search it runs as priced (``--target``)."""

    name: str  # autopipe, megatron, torchtitan, torch
    label: str  # how messages name it: "Megatron-LM"
    schedules: tuple[str, ...]  # the schedules it runs (search order)
    uniform_recompute: bool  # it recomputes every stage or none (one mode for all stages)

    def restricts(self) -> bool:
        """Whether the target searches less than autopipe does."""
        return self.uniform_recompute or set(self.schedules) != set(schedule_names())

    def runs(self, schedule: str, recompute: Sequence[bool]) -> bool:
        """Whether it runs ``schedule`` with stages recomputed as ``recompute`` says, as priced."""
        uneven = any(recompute) and not all(recompute)
        return schedule in self.schedules and not (self.uniform_recompute and uneven)

    def searched(self) -> str:
        """``1f1b or interleaved-1f1b, every stage recomputed or none``: what its search keeps to."""
        if set(self.schedules) == set(schedule_names()):
            said = "any schedule"
        elif len(self.schedules) == 1:
            said = self.schedules[0]
        else:
            said = ", ".join(self.schedules[:-1]) + " or " + self.schedules[-1]
        return said + (", every stage recomputed or none" if self.uniform_recompute else "")


def _targets() -> tuple[Target, ...]:
    every = tuple(s.name for s in search_order())
    megatron = tuple(s.name for s in search_order() if s.torch_class in ("Schedule1F1B", "ScheduleInterleaved1F1B"))
    titan = tuple(s.name for s in search_order() if s.torch_class)
    return (
        Target("autopipe", "autopipe's executor", every, False),
        Target("megatron", "Megatron-LM", megatron, True),
        Target("torchtitan", "torchtitan", titan, True),
        Target("torch", "torch.distributed.pipelining", every, False),
    )


TARGETS = tuple(t.name for t in _targets())
"""The ``--target`` names; the first, autopipe, is the default (everything)."""


def target_spec(name: str) -> Target:
    """The :class:`Target` called ``name``; PlanError (one line) for another name."""
    for t in _targets():
        if t.name == name:
            return t
    raise PlanError(f"unknown target {name!r}; use one of {', '.join(TARGETS)}")
