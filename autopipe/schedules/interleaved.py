"""Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", section 2.2.2).

Each of the ``S`` devices (ranks) holds ``v`` model chunks: virtual stage ``j = c*S + s``
(chunk ``c`` of rank ``s``, so stage ``j`` runs on rank ``j % S``), and a micro-batch visits
every rank ``v`` times. Units of work on a rank are
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

The planner budgets ``min(w_r + 1, v*m) / v`` micro-batches of activations per chunk of rank
``r`` (``w_r`` its warm-up forwards; ``v*m`` on every rank when ``m == S``, which runs every
forward first) against a limit of ``M / v`` per chunk.
torch.distributed.pipelining's ``ScheduleInterleaved1F1B``.

Tests: tests/schedules/test_schedules.py.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from autopipe.errors import ScheduleError
from autopipe.schedules import one_f_one_b
from autopipe.schedules.action import Schedule
from autopipe.schedules.lists import B, F, RankLists, placed, to_schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.validate import check_sizes

__all__ = ["SPEC", "bubble", "create_lists", "create_schedule", "inflight"]


def _lists(ranks: npt.NDArray[np.int64], devices: int, micro_batches: int, virtual: int) -> RankLists:
    """The interleaved lists of ``ranks`` (a column; warm-up, steady 1F1B, cool-down). A
    rank's ``k``-th forward unit is chunk ``c`` of micro-batch ``g S + i`` for ``(g, c S + i) =
    divmod(k, S v)``, its ``k``-th backward the same with chunk ``v-1-c``; with ``w`` warm-up
    forwards the ``k``-th forward runs at position ``k`` (``k < w``) or ``2k - w``, the
    ``k``-th backward at ``w + 2k + 1`` (steady) or ``v m + k`` (cool-down)."""
    S, v, total = devices, virtual, micro_batches * virtual
    if micro_batches == devices:
        warmup = np.full_like(ranks, total)
    else:
        warmup = np.minimum(total, (devices - ranks - 1) * 2 + (virtual - 1) * devices)
    k = np.arange(total, dtype=np.int64)[None, :]
    group, within = np.divmod(k, S * v)
    chunk, mb = within // S, group * S + within % S
    forward = np.where(k < warmup, k, 2 * k - warmup)
    backward = np.where(k < total - warmup, warmup + 2 * k + 1, total + k)
    return placed(
        len(ranks), 2 * total, (F, chunk * S + ranks, forward, mb), (B, (v - 1 - chunk) * S + ranks, backward, mb)
    )


def create_lists(devices: int, micro_batches: int, virtual: int = 1) -> RankLists:
    """The interleaved 1F1B schedule as integer arrays; ``virtual == 1`` gives 1F1B's."""
    check_sizes(devices, micro_batches, virtual)
    if virtual == 1:
        return one_f_one_b.create_lists(devices, micro_batches)
    if micro_batches % devices:
        lower = micro_batches // devices * devices
        fix = f"use {lower} or {lower + devices}" if lower else f"use {devices}"
        raise ScheduleError(
            f"interleaved-1f1b needs micro-batches divisible by devices (micro_batches: "
            f"{micro_batches}, devices: {devices}); {fix} micro-batches"
        )
    return _lists(np.arange(devices, dtype=np.int64)[:, None], devices, micro_batches, virtual)


def create_schedule(devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
    """:func:`create_lists` as Actions; ``virtual == 1`` gives the 1F1B schedule."""
    return to_schedule(create_lists(devices, micro_batches, virtual))


def inflight(devices: int, micro_batches: int, virtual: int = 1) -> tuple[float, ...]:
    """Chunk ``j`` of rank ``r = j % S``: ``min(w_r + 1, v m) / v`` (the rank's peak shared
    evenly by its chunks), ``w_r`` its warm-up forwards (:func:`create_lists`): all ``v m``
    when ``m == S``, else ``2 (S-r-1) + (v-1) S``. A rank holds its warm-up forwards and the
    steady state's first forward before its first backward frees one; with ``m == S`` it runs
    every forward first, ``v m`` in all, on every rank (exactly what the simulator counts,
    every ``S <= 8``, ``v <= 4``, ``m <= 32``; tests/schedules/test_registry.py)."""
    S, m, v = devices, micro_batches, virtual
    warm = [v * m if m == S else 2 * (S - r - 1) + (v - 1) * S for r in range(S)]
    return tuple(min(warm[j % S] + 1, v * m) / v for j in range(S * v))


def bubble(devices: int, micro_batches: int, virtual: int = 1) -> float:
    """``(S-1) / (v*m + S-1)``: chunks of ``1/v`` a stage's time shrink it by ``v``."""
    return (devices - 1) / (virtual * micro_batches + devices - 1)


SPEC = ScheduleSpec(
    name="interleaved-1f1b",
    create_schedule=create_schedule,
    create_lists=create_lists,
    inflight=inflight,
    bubble=bubble,
    torch_class="ScheduleInterleaved1F1B",
    preference=3,
    torch_multi=True,
    virtual_choices=(2, 4),
    micro_batches_multiple_of_devices=True,
)
