"""GPipe: all forwards, then all backwards (Huang et al. 2019, "GPipe").

Every rank runs the forward of all ``m`` micro-batches, then their backwards in the same
order, so each stage holds the activations of all ``m`` micro-batches at its peak. With equal
stage times the bubble is ``(S-1) / (m+S-1)`` of the iteration (``S`` devices). ``S=3, m=2`` (time runs right,
``f`` = one forward, backward twice as long)::

    rank 0 | 0F0 0F1 .   .   .   .   .   .   0B0 0B0 0B1 0B1
    rank 1 | .   1F0 1F1 .   .   .   1B0 1B0 1B1 1B1 .   .
    rank 2 | .   .   2F0 2F1 2B0 2B0 2B1 2B1 .   .   .   .

Only ``virtual == 1`` (one stage per rank); torch.distributed.pipelining's ``ScheduleGPipe``.
"""

from __future__ import annotations

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Action, Kind, Schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.validate import check_sizes

__all__ = ["SPEC", "bubble", "create_schedule", "inflight"]


def create_schedule(devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
    """Rank ``s``: ``sF0 .. sF(m-1)`` then ``sB0 .. sB(m-1)``."""
    check_sizes(devices, micro_batches, virtual)
    if virtual != 1:
        raise ScheduleError(
            f"gpipe runs one stage per rank (got virtual: {virtual}); use virtual=1, "
            "or the interleaved-1f1b schedule for virtual stages"
        )
    return {
        s: [
            *(Action(s, Kind.FORWARD, mb) for mb in range(micro_batches)),
            *(Action(s, Kind.BACKWARD, mb) for mb in range(micro_batches)),
        ]
        for s in range(devices)
    }


def inflight(devices: int, micro_batches: int, virtual: int = 1) -> tuple[float, ...]:
    """Every stage holds all ``m`` micro-batches."""
    return (float(micro_batches),) * (devices * virtual)


def bubble(devices: int, micro_batches: int, virtual: int = 1) -> float:
    """``(S-1) / (m+S-1)``."""
    return (devices - 1) / (micro_batches + devices - 1)


SPEC = ScheduleSpec(
    name="gpipe",
    create_schedule=create_schedule,
    inflight=inflight,
    bubble=bubble,
    torch_class="ScheduleGPipe",
    preference=2,
)
