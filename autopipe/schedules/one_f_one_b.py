"""1F1B, PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
Training"; the non-interleaved schedule of Megatron-LM).

Rank ``s`` of ``S`` first runs ``k = min(m, S-s-1)`` warm-up forwards, then alternates one
forward and one backward (steady state) until every forward has run, then drains the
remaining ``k`` backwards (cool-down). A stage therefore holds the activations of at most
``min(m, S-s)`` micro-batches, against ``m`` for GPipe, with the same bubble
``(S-1) / (m+S-1)`` for equal stage times. ``S=3, m=4`` (backward twice a forward)::

    rank 0 | 0F0 0F1 0F2 .   .   .   .   0B0 0B0 0F3 0B1 0B1 .   0B2 0B2 .   0B3 0B3
    rank 1 | .   1F0 1F1 .   .   1B0 1B0 1F2 1B1 1B1 1F3 1B2 1B2 .   1B3 1B3 .   .
    rank 2 | .   .   2F0 2B0 2B0 2F1 2B1 2B1 2F2 2B2 2B2 2F3 2B3 2B3 .   .   .   .

Only ``virtual == 1``; see ``interleaved.py`` for virtual stages.
"""

from __future__ import annotations

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Schedule
from autopipe.schedules.validate import check_sizes

__all__ = ["create_schedule", "rank_actions"]


def rank_actions(stage: int, stages: int, microbatches: int) -> list[Action]:
    """The 1F1B list of rank ``stage`` (warm-up, steady 1F1B, cool-down)."""
    warmup = min(microbatches, stages - stage - 1)
    actions = [Action(stage, "F", mb) for mb in range(warmup)]
    for i in range(microbatches - warmup):
        actions += [Action(stage, "F", warmup + i), Action(stage, "B", i)]
    actions += [Action(stage, "B", mb) for mb in range(microbatches - warmup, microbatches)]
    return actions


def create_schedule(stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The 1F1B schedule: ``{rank: rank_actions(rank, stages, microbatches)}``."""
    check_sizes(stages, microbatches, virtual)
    if virtual != 1:
        raise ScheduleError(
            f"1f1b runs one stage per rank (got virtual: {virtual}); use virtual=1, "
            "or the interleaved-1f1b schedule for virtual stages"
        )
    return {s: [*rank_actions(s, stages, microbatches)] for s in range(stages)}
