"""1F1B, PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
Training"; the non-interleaved schedule of Megatron-LM).

Rank ``s`` of ``S`` devices first runs ``k = min(m, S-s-1)`` warm-up forwards, then alternates one
forward and one backward (steady state) until every forward has run, then drains the
remaining ``k`` backwards (cool-down). A stage therefore holds the activations of at most
``min(m, S-s)`` micro-batches, against ``m`` for GPipe, with the same bubble
``(S-1) / (m+S-1)`` for equal stage times. ``S=3, m=4`` (backward twice a forward)::

    rank 0 | 0F0 0F1 0F2 .   .   .   .   0B0 0B0 0F3 0B1 0B1 .   0B2 0B2 .   0B3 0B3
    rank 1 | .   1F0 1F1 .   .   1B0 1B0 1F2 1B1 1B1 1F3 1B2 1B2 .   1B3 1B3 .   .
    rank 2 | .   .   2F0 2B0 2B0 2F1 2B1 2B1 2F2 2B2 2B2 2F3 2B3 2B3 .   .   .   .

Only ``virtual == 1``; see ``interleaved.py`` for virtual stages. torch.distributed.pipelining's
``Schedule1F1B``.

Tests: tests/schedules/test_schedules.py.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Schedule
from autopipe.schedules.lists import B, F, RankLists, placed, to_schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.validate import check_sizes

__all__ = ["SPEC", "bubble", "create_lists", "create_schedule", "inflight"]


def _lists(ranks: npt.NDArray[np.int64], devices: int, micro_batches: int) -> RankLists:
    """The lists of ``ranks`` (a column): rank ``r``'s ``k``-th forward runs at ``k`` in the
    warm-up (``k < w``, ``w = min(m, S-r-1)``), else at ``2k - w``; its ``k``-th backward at
    ``w + 2k + 1`` in the steady state (``k < m - w``), else at ``m + k``."""
    m = micro_batches
    w = np.minimum(m, devices - 1 - ranks)
    k = np.arange(m, dtype=np.int64)[None, :]
    forward = np.where(k < w, k, 2 * k - w)
    backward = np.where(k < m - w, w + 2 * k + 1, m + k)
    return placed(len(ranks), 2 * m, (F, ranks, forward, k), (B, ranks, backward, k))


def create_lists(devices: int, micro_batches: int, virtual: int = 1) -> RankLists:
    """The 1F1B schedule as integer arrays: rank ``r`` runs stage ``r``, warm-up, steady 1F1B,
    cool-down."""
    check_sizes(devices, micro_batches, virtual)
    if virtual != 1:
        raise ScheduleError(
            f"1f1b runs one stage per rank (got virtual: {virtual}); use virtual=1, "
            "or the interleaved-1f1b schedule for virtual stages"
        )
    return _lists(np.arange(devices, dtype=np.int64)[:, None], devices, micro_batches)


def create_schedule(devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
    """:func:`create_lists` as Actions."""
    return to_schedule(create_lists(devices, micro_batches, virtual))


def inflight(devices: int, micro_batches: int, virtual: int = 1) -> tuple[float, ...]:
    """Stage ``s`` holds ``min(m, S-s)`` micro-batches (PipeDream-Flush)."""
    return tuple(float(min(micro_batches, devices - s)) for s in range(devices))


def bubble(devices: int, micro_batches: int, virtual: int = 1) -> float:
    """``(S-1) / (m+S-1)``, as GPipe."""
    return (devices - 1) / (micro_batches + devices - 1)


SPEC = ScheduleSpec(
    name="1f1b",
    create_schedule=create_schedule,
    create_lists=create_lists,
    inflight=inflight,
    bubble=bubble,
    torch_class="Schedule1F1B",
    preference=0,
)
