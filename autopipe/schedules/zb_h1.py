"""ZB-H1, the memory-neutral Zero Bubble schedule (Qi et al. 2023, "Zero Bubble Pipeline
Parallelism", section 3).

The backward is split into ``B`` (gradient of the stage input, on the critical path) and
``W`` (gradient of the weights, needed only by the optimizer step). Rank ``s`` of ``S`` runs
the 1F1B skeleton (``min(m, S-s-1)`` warm-up forwards, then F/B pairs, then the remaining
Bs) and holds back ``W``: its first ``s`` steady-state pairs run no ``W``, every later F/B
pair and every cool-down B is followed by the oldest pending ``W``, and the ``s`` still
pending run at the end, where they fill the tail bubble. The number of micro-batches whose
full activations a stage holds (F done, B not) stays ``min(m, S-s)`` as in 1F1B; the
deferred Ws (at most ``s``) only keep their weight-grad inputs, so rank ``s`` peaks at
``(S-s)`` activations plus ``s`` weight-grad remainders, never above rank 0's 1F1B peak.

For ``m >= S`` and ``W <= F`` the simulated bubble is ``(S-1)(F+B-W)`` per rank (the paper's
value; 1F1B's is ``(S-1)(F+B+W)`` with its backward ``B + W``): with ``F = B = W`` a third.
Fewer micro-batches leave too few Ws to fill the tail.
``S=3, m=4``, all actions one unit (bubble 2 units per rank; 1F1B would idle 6)::

    rank 0 | 0F0 0F1 0F2 .   .   0B0 0W0 0F3 0B1 0W1 0B2 0W2 0B3 0W3
    rank 1 | .   1F0 1F1 .   1B0 1F2 1B1 1W0 1F3 1B2 1W1 1B3 1W2 1W3
    rank 2 | .   .   2F0 2B0 2F1 2B1 2F2 2B2 2W0 2F3 2B3 2W1 2W2 2W3

Only ``virtual == 1``.
"""

from __future__ import annotations

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Schedule
from autopipe.schedules.validate import check_sizes

__all__ = ["create_schedule", "rank_actions"]


def rank_actions(stage: int, stages: int, microbatches: int) -> list[Action]:
    """The ZB-H1 list of rank ``stage``: 1F1B with each W delayed by ``stage`` pairs."""
    warmup = min(microbatches, stages - stage - 1)
    actions = [Action(stage, "F", mb) for mb in range(warmup)]
    weights = 0  # Ws emitted so far; W i runs once B i and `stage` more pairs have run

    def weight() -> None:
        nonlocal weights
        actions.append(Action(stage, "W", weights))
        weights += 1

    for i in range(microbatches - warmup):
        actions += [Action(stage, "F", warmup + i), Action(stage, "B", i)]
        if i >= stage:
            weight()
    for mb in range(microbatches - warmup, microbatches):
        actions.append(Action(stage, "B", mb))
        weight()
    while weights < microbatches:
        weight()
    return actions


def create_schedule(stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The ZB-H1 schedule: ``{rank: rank_actions(rank, stages, microbatches)}``."""
    check_sizes(stages, microbatches, virtual)
    if virtual != 1:
        raise ScheduleError(
            f"zb-h1 runs one stage per rank (got virtual: {virtual}); use virtual=1"
        )
    return {s: [*rank_actions(s, stages, microbatches)] for s in range(stages)}
