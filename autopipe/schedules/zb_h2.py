"""ZB-H2, the Zero Bubble schedule at twice 1F1B's memory (Qi et al. 2023, "Zero Bubble
Pipeline Parallelism", section 3: ZB-H2).

One stage per rank (``virtual == 1``), the backward split into B and W. Each rank may hold
``2S-1`` micro-batches (F done, W not): more forwards in the warm-up than 1F1B's ``S-s``, and
the Ws left for the gaps, so the pipeline never waits once it is full. The lists are those of
one rule, run slot by slot with every action one unit: at each step rank ``s`` runs

1. its next B if it can (its F done, and rank ``s+1``'s B of that micro-batch);
2. else its next F if it can (rank ``s-1``'s F done) and it holds fewer than ``2S-1``;
3. else its oldest pending W;

so the warm-up fills with forwards, the steady state alternates B and F and runs a W only
when the rank holds ``2S-1`` or would wait, and the Ws still pending fill the cool-down.
(:func:`create_lists` runs the rule on integer counts, and tiles the steady state once it
repeats: three slots of one F, one B and one W on every rank; exact, see ``_kinds``.)
``S=3, m=6``, every action one unit::

    rank 0 | 0F0 0F1 0F2 0F3 0F4 0B0 0W0 0B1 0F5 0B2 0W1 0B3 0W2 0B4 0W3 0W4 0B5 0W5 -   -
    rank 1 | -   1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1W0 1B3 1F5 1B4 1W1 1W2 1B5 1W3 1W4 1W5 -
    rank 2 | -   -   2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2F4 2B4 2W0 2F5 2B5 2W1 2W2 2W3 2W4 2W5

Bubble (F = B = W = one unit, a rank's work ``3m``): the iteration takes
``3m + S - 1`` units once ``m >= S`` — only the ramp before the last rank's first forward,
the paper's zero bubble ``(S-1)(F+B-2W)``; from ``m >= 2S-1`` on no rank idles between its
first and last action — and ``S - m`` more with fewer micro-batches
(:func:`makespan_units`, checked against the simulator for every ``S <= 8``, ``m <= 32``).
The paper's gain over ZB-H1 (``(S-1)(F+B-W)``) shows when the times differ: with
``B = 2F = 2W`` (``S = 8``, ``m = 32``) ZB-H2 takes the least possible, the work plus the
forward ramp (135 units), ZB-H1 142; with ``F = B = W`` both reach it.
Memory: every rank peaks at ``min(m, 2S-1)`` micro-batches from F to W (:func:`inflight`,
exact in the simulator), the paper's ``2p-1``; 1F1B's rank 0 holds ``S``.

Searched like the others (its decisions cost the planner nothing measurable on 1,000 blocks x
64 devices: the decision bound of one stage per device prunes them); torch.distributed.pipelining
has no class for it: run it with autopipe's executor.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Schedule
from autopipe.schedules.lists import B, F, RankLists, W, tiled, to_schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.validate import check_sizes

__all__ = ["SPEC", "bubble", "create_lists", "create_schedule", "inflight", "makespan_units"]


def _kinds(devices: int, micro_batches: int) -> list[list[tuple[list[int], int]]]:
    """Per rank, the kinds (0 F, 1 B, 2 W) the rule of the module docstring runs, slot by slot,
    as ``(kinds, times)`` segments (:func:`~autopipe.schedules.lists.tiled`'s parts).

    The counts of F, B and W each rank has run at a slot's start decide the slot (a rank reads
    its own and its neighbours'), and only through differences — except ``F < m``. So once
    three slots in a row ran one F, one B and one W on every rank, the next three repeat them
    with every count one higher, and so on for as long as no count of F can reach ``m``: the
    steady state is that window tiled, ``k`` more times, in one step (exact, not a guess)."""
    S, m, most = devices, micro_batches, 2 * devices - 1
    f, b, w = [0] * S, [0] * S, [0] * S  # Fs, Bs and Ws run, per rank
    kinds: list[list[int]] = [[] for _ in range(S)]  # since the last tiling
    parts: list[list[tuple[list[int], int]]] = [[] for _ in range(S)]
    window: deque[tuple[list[int], list[int], list[int]]] = deque(maxlen=3)  # slot starts
    last = S - 1
    while min(w) < m:
        window.append((f[:], b[:], w[:]))
        pf, pb = window[-1][0], window[-1][1]  # run before this slot: done
        for s in range(S):
            fs, bs = pf[s], pb[s]
            if bs < fs and (s == last or pb[s + 1] > bs):
                b[s] += 1
                kinds[s].append(B)
            elif fs < m and fs - w[s] < most and (s == 0 or pf[s - 1] > fs):
                f[s] += 1
                kinds[s].append(F)
            elif w[s] < bs:
                w[s] += 1
                kinds[s].append(W)
        if len(window) == 3 and sum(f) - sum(window[0][0]) == S and _one_each(window[0], f, b, w):
            k = m - 1 - max(window[-1][0])  # rounds before a count of F could reach m
            if k > 0:
                for s in range(S):
                    parts[s] += [(kinds[s], 1), (kinds[s][-3:], k)]
                    kinds[s] = []
                    f[s], b[s], w[s] = f[s] + k, b[s] + k, w[s] + k
            window.clear()
    return [[*mine, (rest, 1)] for mine, rest in zip(parts, kinds, strict=True)]


def _one_each(before: tuple[list[int], list[int], list[int]], *now: list[int]) -> bool:
    """Whether every rank ran exactly one F, one B and one W since ``before``."""
    return all(x - y == 1 for was, counts in zip(before, now, strict=True) for x, y in zip(counts, was, strict=True))


def create_lists(devices: int, micro_batches: int, virtual: int = 1) -> RankLists:
    """The lists the rule of the module docstring runs, as integer arrays."""
    check_sizes(devices, micro_batches, virtual)
    if virtual != 1:
        raise ScheduleError(f"zb-h2 runs one stage per device (got virtual: {virtual}); use virtual=1")
    return tuple(
        tiled(*((np.asarray(kinds, dtype=np.int64) + 3 * s, times) for kinds, times in parts))
        for s, parts in enumerate(_kinds(devices, micro_batches))
    )


def create_schedule(devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
    """:func:`create_lists` as Actions."""
    return to_schedule(create_lists(devices, micro_batches, virtual))


def inflight(devices: int, micro_batches: int, virtual: int = 1) -> tuple[float, ...]:
    """``min(m, 2S-1)`` micro-batches per stage, F to W."""
    return (float(min(micro_batches, 2 * devices - 1)),) * devices


def makespan_units(devices: int, micro_batches: int) -> int:
    """``3m + S - 1``, plus ``S - m`` when ``m < S``, with F, B and W of one unit each."""
    S, m = devices, micro_batches
    return 3 * m + S - 1 + max(0, S - m)


def bubble(devices: int, micro_batches: int, virtual: int = 1) -> float:
    """``1 - 3m / makespan_units``: ``(S-1) / (3m+S-1)`` once ``m >= S``."""
    return 1.0 - 3 * micro_batches / makespan_units(devices, micro_batches)


SPEC = ScheduleSpec(
    name="zb-h2",
    create_schedule=create_schedule,
    create_lists=create_lists,
    inflight=inflight,
    bubble=bubble,
    torch_class="",  # torch.distributed.pipelining has none
    preference=9,
    splits_backward=True,
)
