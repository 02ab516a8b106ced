"""The event simulator: a schedule's iteration time, bubble and peak memory per device.

- :func:`simulate`: one schedule and its stage costs, validated, walked event by event
  (:mod:`.events`);
- :func:`compile_schedule` / :func:`simulate_many`: compile once, price many candidates on flat
  arrays (:mod:`.simcore`, the hot loops in C with a Python twin);
- :func:`replay`: the full :class:`Timeline` of a compiled schedule, fast (:mod:`.replay`);
- :func:`with_send_cost`: the executor's cost per send, on the actions that send to another
  rank (:mod:`.sends`).

No torch here.
"""

from autopipe.simulate.events import (
    ActionTiming,
    CompiledSchedule,
    StageCost,
    Summary,
    Timeline,
    compile_lists,
    compile_schedule,
    simulate,
    simulate_many,
    simulate_summary,
)
from autopipe.simulate.replay import replay
from autopipe.simulate.sends import sends_of, with_send_cost

__all__ = [
    "ActionTiming",
    "CompiledSchedule",
    "StageCost",
    "Summary",
    "Timeline",
    "compile_lists",
    "compile_schedule",
    "replay",
    "sends_of",
    "simulate",
    "simulate_many",
    "simulate_summary",
    "with_send_cost",
]
