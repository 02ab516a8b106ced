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

Only ``virtual == 1``. The planner budgets ``min(m, S)`` micro-batches of activations on
every stage (W keeps inputs alive past B; conservative). torch.distributed.pipelining runs it
as ``ScheduleInterleavedZeroBubble`` (torch's ZB schedule; with one stage per rank it is
ZB-H1-like).

Tests: tests/schedules/test_schedules.py.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Schedule
from autopipe.schedules.lists import B, F, RankLists, W, placed, to_schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.validate import check_sizes

__all__ = ["SPEC", "bubble", "create_lists", "create_schedule", "inflight"]


def _lists(ranks: npt.NDArray[np.int64], devices: int, micro_batches: int) -> RankLists:
    """The lists of ``ranks`` (a column), by where each action runs. Rank ``r``: ``w =
    min(m, S-r-1)`` warm-up Fs, ``n = m - w`` steady pairs ``F B``, those from the ``r``-th on
    followed by a W (``n_w = max(0, n - r)`` of them), then ``w`` times ``B W`` from ``c = w +
    2n + n_w`` on, then the rest of the Ws; pair ``i`` starts at ``w + 2i + max(0, i - r)``."""
    m, r = micro_batches, ranks
    w = np.minimum(m, devices - 1 - r)
    steady = m - w
    early_ws = np.maximum(0, steady - r)
    cool = w + 2 * steady + early_ws
    k = np.arange(m, dtype=np.int64)[None, :]
    forward = np.where(k < w, k, 2 * k - w + np.maximum(0, k - w - r))
    backward = np.where(k < steady, w + 2 * k + 1 + np.maximum(0, k - r), cool + 2 * (k - steady))
    weight = np.where(
        k < early_ws,
        w + 3 * k + 2 * r + 2,
        np.where(k < early_ws + w, cool + 2 * (k - early_ws) + 1, cool + w + k - early_ws),
    )
    return placed(len(r), 3 * m, (F, r, forward, k), (B, r, backward, k), (W, r, weight, k))


def create_lists(devices: int, micro_batches: int, virtual: int = 1) -> RankLists:
    """The ZB-H1 schedule as integer arrays: rank ``r`` runs stage ``r``, 1F1B with each W
    delayed by ``r`` pairs."""
    check_sizes(devices, micro_batches, virtual)
    if virtual != 1:
        raise ScheduleError(f"zb-h1 runs one stage per rank (got virtual: {virtual}); use virtual=1")
    return _lists(np.arange(devices, dtype=np.int64)[:, None], devices, micro_batches)


def create_schedule(devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
    """:func:`create_lists` as Actions."""
    return to_schedule(create_lists(devices, micro_batches, virtual))


def inflight(devices: int, micro_batches: int, virtual: int = 1) -> tuple[float, ...]:
    """``min(m, S)`` on every stage: at most ``S-s`` full activations plus ``s`` weight-grad
    remainders on rank ``s``, counted as whole micro-batches (conservative)."""
    return (float(min(micro_batches, devices)),) * devices


def bubble(devices: int, micro_batches: int, virtual: int = 1) -> float:
    """``(S-1) / (3m+S-1)`` when F, B and W take equal time (``(S-1)(F+B-W)`` per rank)."""
    return (devices - 1) / (3 * micro_batches + devices - 1)


SPEC = ScheduleSpec(
    name="zb-h1",
    create_schedule=create_schedule,
    create_lists=create_lists,
    inflight=inflight,
    bubble=bubble,
    torch_class="ScheduleInterleavedZeroBubble",
    preference=1,
    torch_multi=True,
    splits_backward=True,
)
