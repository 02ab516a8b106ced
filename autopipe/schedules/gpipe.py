"""GPipe: all forwards, then all backwards (Huang et al. 2019, "GPipe").

Every rank runs the forward of all ``m`` micro-batches, then their backwards in the same
order, so each stage holds the activations of all ``m`` micro-batches at its peak. With equal
stage times the bubble is ``(S-1) / (m+S-1)`` of the iteration (``S`` devices). ``S=3, m=2`` (time runs right,
``f`` = one forward, backward twice as long)::

    rank 0 | 0F0 0F1 .   .   .   .   .   .   0B0 0B0 0B1 0B1
    rank 1 | .   1F0 1F1 .   .   .   1B0 1B0 1B1 1B1 .   .
    rank 2 | .   .   2F0 2F1 2B0 2B0 2B1 2B1 .   .   .   .

Only ``virtual == 1`` (one stage per rank); torch.distributed.pipelining's ``ScheduleGPipe``.

Tests: tests/schedules/test_schedules.py.
"""

from __future__ import annotations

import numpy as np

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Schedule
from autopipe.schedules.lists import B, F, RankLists, to_schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.validate import check_sizes

__all__ = ["SPEC", "bubble", "create_lists", "create_schedule", "inflight"]


def create_lists(devices: int, micro_batches: int, virtual: int = 1) -> RankLists:
    """Rank ``s``: ``sF0 .. sF(m-1)`` then ``sB0 .. sB(m-1)``, as integer arrays."""
    check_sizes(devices, micro_batches, virtual)
    if virtual != 1:
        raise ScheduleError(
            f"gpipe runs one stage per rank (got virtual: {virtual}); use virtual=1, "
            "or the interleaved-1f1b schedule for virtual stages"
        )
    m = micro_batches
    rows = np.empty((2 * m, 3), dtype=np.int64)
    rows[:m, 1], rows[m:, 1] = F, B
    rows[:, 2] = np.tile(np.arange(m), 2)
    lists = []
    for s in range(devices):
        rows[:, 0] = s
        lists.append(rows.copy())
    return tuple(lists)


def create_schedule(devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
    """:func:`create_lists` as Actions."""
    return to_schedule(create_lists(devices, micro_batches, virtual))


def inflight(devices: int, micro_batches: int, virtual: int = 1) -> tuple[float, ...]:
    """Every stage holds all ``m`` micro-batches."""
    return (float(micro_batches),) * (devices * virtual)


def bubble(devices: int, micro_batches: int, virtual: int = 1) -> float:
    """``(S-1) / (m+S-1)``."""
    return (devices - 1) / (micro_batches + devices - 1)


SPEC = ScheduleSpec(
    name="gpipe",
    create_schedule=create_schedule,
    create_lists=create_lists,
    inflight=inflight,
    bubble=bubble,
    torch_class="ScheduleGPipe",
    preference=2,
)
