"""GPipe: all forwards, then all backwards (Huang et al. 2019, "GPipe").

Every rank runs the forward of all ``m`` micro-batches, then their backwards in the same
order, so each stage holds the activations of all ``m`` micro-batches at its peak. With equal
stage times the bubble is ``(S-1) / (m+S-1)`` of the iteration. ``S=3, m=2`` (time runs right,
``f`` = one forward, backward twice as long)::

    rank 0 | 0F0 0F1 .   .   .   .   .   .   0B0 0B0 0B1 0B1
    rank 1 | .   1F0 1F1 .   .   .   1B0 1B0 1B1 1B1 .   .
    rank 2 | .   .   2F0 2F1 2B0 2B0 2B1 2B1 .   .   .   .

Only ``virtual == 1`` (one stage per rank).
"""

from __future__ import annotations

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Schedule
from autopipe.schedules.validate import check_sizes

__all__ = ["create_schedule"]


def create_schedule(stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """Rank ``s``: ``sF0 .. sF(m-1)`` then ``sB0 .. sB(m-1)``."""
    check_sizes(stages, microbatches, virtual)
    if virtual != 1:
        raise ScheduleError(
            f"gpipe runs one stage per rank (got virtual: {virtual}); use virtual=1, "
            "or the interleaved-1f1b schedule for virtual stages"
        )
    return {
        s: [
            *(Action(s, "F", mb) for mb in range(microbatches)),
            *(Action(s, "B", mb) for mb in range(microbatches)),
        ]
        for s in range(stages)
    }
