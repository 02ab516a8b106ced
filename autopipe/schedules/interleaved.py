"""Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", section 2.2.2).

Each of the ``S`` ranks holds ``v`` model chunks: virtual stage ``j = c*S + s`` (chunk ``c``
of rank ``s``), so a micro-batch visits every rank ``v`` times. Units of work on a rank are
taken in groups of ``S`` micro-batches: forward of chunk 0 for micro-batches ``0..S-1``, then
chunk 1 for the same micro-batches, ... chunk ``v-1``, then the next ``S`` micro-batches;
backwards go through the chunks in reverse (``v-1`` first). Rank ``s`` runs
``(S-s-1)*2 + (v-1)*S`` warm-up forwards (all ``v*m`` when ``m == S``), then one forward and
one backward alternately, then the remaining backwards. The bubble shrinks by ``v`` to
``(S-1) / (v*m + S-1)`` for chunks that each take ``1/v`` of a stage's time.

Requires ``m % S == 0`` (as Megatron-LM did when the paper appeared); other ``m`` raise
ScheduleError. ``virtual == 1`` gives plain 1F1B. ``S=2, v=2, m=4``, every action one unit
(stages 0 and 2 live on rank 0, stages 1 and 3 on rank 1)::

    rank 0 | 0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 .   2B2 .   2B3 0B2 0B3
    rank 1 | .   1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3 .

Bubble: 2 of 18 units per rank = (S-1) / (v*m + S-1) = 1/9.
"""

from __future__ import annotations

from autopipe.errors import ScheduleError
from autopipe.schedules import one_f_one_b
from autopipe.schedules.action import Action, Schedule
from autopipe.schedules.validate import check_sizes

__all__ = ["create_schedule", "rank_actions"]


def _unit(k: int, rank: int, stages: int, virtual: int, forward: bool) -> Action:
    """The ``k``-th forward (or backward) unit of ``rank``."""
    group, within = divmod(k, stages * virtual)
    chunk = within // stages
    if not forward:
        chunk = virtual - 1 - chunk
    mb = group * stages + within % stages
    return Action(chunk * stages + rank, "F" if forward else "B", mb)


def rank_actions(rank: int, stages: int, microbatches: int, virtual: int) -> list[Action]:
    """The interleaved list of ``rank`` (warm-up, steady 1F1B, cool-down)."""
    total = microbatches * virtual
    if microbatches == stages:
        warmup = total
    else:
        warmup = min(total, (stages - rank - 1) * 2 + (virtual - 1) * stages)
    actions = [_unit(k, rank, stages, virtual, True) for k in range(warmup)]
    for i in range(total - warmup):
        actions.append(_unit(warmup + i, rank, stages, virtual, True))
        actions.append(_unit(i, rank, stages, virtual, False))
    actions += [_unit(k, rank, stages, virtual, False) for k in range(total - warmup, total)]
    return actions


def create_schedule(stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The interleaved 1F1B schedule; ``virtual == 1`` returns the 1F1B schedule."""
    check_sizes(stages, microbatches, virtual)
    if virtual == 1:
        return one_f_one_b.create_schedule(stages, microbatches)
    if microbatches % stages:
        lower = microbatches // stages * stages
        fix = f"use {lower} or {lower + stages}" if lower else f"use {stages}"
        raise ScheduleError(
            f"interleaved-1f1b needs micro-batches divisible by stages (microbatches: "
            f"{microbatches}, stages: {stages}); {fix} micro-batches"
        )
    return {s: [*rank_actions(s, stages, microbatches, virtual)] for s in range(stages)}
