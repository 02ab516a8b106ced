"""Data dependencies between actions, and running a schedule's lists in order.

For virtual stages ``0 .. n-1`` (``n = S * v``) and one micro-batch:

- ``F(j)`` needs ``F(j-1)`` (the activation from the previous stage);
- ``B(j)`` needs ``F(j)`` (its own saved activations) and ``B(j+1)`` (the gradient of its
  output); the last stage's ``B`` needs only its own ``F`` (the loss);
- ``W(j)`` needs ``B(j)``.

Each rank runs its list strictly in order; a rank whose next action waits on an action that
never runs (another rank is stuck too, or it is not in the schedule) is deadlocked.

Tests: tests/schedules/test_schedules.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopipe.schedules.action import Action, Kind, Schedule

__all__ = ["Execution", "Stuck", "dependencies", "execute_in_order"]


def dependencies(action: Action, num_stages: int) -> tuple[Action, ...]:
    """The actions that must finish before ``action`` may start (``num_stages = S * v``)."""
    j, mb = action.stage, action.microbatch
    if action.kind is Kind.FORWARD:
        return (Action(j - 1, Kind.FORWARD, mb),) if j > 0 else ()
    if action.kind is Kind.BACKWARD:
        own = Action(j, Kind.FORWARD, mb)
        return (own, Action(j + 1, Kind.BACKWARD, mb)) if j + 1 < num_stages else (own,)
    return (Action(j, Kind.BACKWARD, mb),)


@dataclass(frozen=True)
class Stuck:
    """A rank that cannot run its next step: ``waits_for`` never finishes."""

    rank: int
    step: int  # index into the rank's list (idle slots counted)
    action: Action
    waits_for: tuple[Action, ...]

    def describe(self) -> str:
        waits = ", ".join(str(a) for a in self.waits_for)
        return f"rank {self.rank} step {self.step}: {self.action} waits for {waits}"


@dataclass(frozen=True)
class Execution:
    """``order`` lists ``(rank, step)`` in an order that respects every dependency and each
    rank's list; ``stuck`` is empty unless the schedule deadlocks."""

    order: tuple[tuple[int, int], ...]
    stuck: tuple[Stuck, ...]


def execute_in_order(schedule: Schedule, num_stages: int) -> Execution:
    """Run every rank's list in order, each action once its dependencies have run."""
    done: set[Action] = set()
    order: list[tuple[int, int]] = []
    pointer = dict.fromkeys(schedule, 0)
    progress = True
    while progress:
        progress = False
        for rank in sorted(schedule):
            actions = schedule[rank]
            while pointer[rank] < len(actions):
                action = actions[pointer[rank]]
                if action is not None:
                    if not all(d in done for d in dependencies(action, num_stages)):
                        break
                    done.add(action)
                    order.append((rank, pointer[rank]))
                    progress = True
                pointer[rank] += 1
    stuck = []
    for rank in sorted(schedule):
        step = pointer[rank]
        if step < len(schedule[rank]):
            action = schedule[rank][step]
            assert action is not None  # idle slots never stop a rank
            waits = tuple(d for d in dependencies(action, num_stages) if d not in done)
            stuck.append(Stuck(rank, step, action, waits))
    return Execution(tuple(order), tuple(stuck))
