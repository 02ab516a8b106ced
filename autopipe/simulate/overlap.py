"""What data-parallel communication sticks out of a pipeline's iteration: each chunk's gradients
reduced as its last backward runs, its weights gathered under its first forward.

The simulator gives every action's start and end (:mod:`.simcore`). Per virtual stage (chunk) j,
its *last backward* -- the last action that makes weight gradients, W where the schedule splits
the backward, else B -- runs ``[s_j, e_j]``; its *first forward* ``[a_j, z_j]``. A device's
collectives run one at a time (one stream), in the order they become possible; ``R_j`` and
``G_j`` are chunk j's reduce and gather times (``planner.placement.step_comm``)::

    reduce, overlapped   in the order the chunks' last backwards end: starts at max(free, s_j),
                         ends at max(e_j, start + R_j) (the gradients come out layer by layer
                         through the last backward and go out bucket by bucket, as Megatron-LM's
                         --overlap-grad-reduce and FSDP send them)
    gather, overlapped   in the order the chunks' first forwards start, from the step's start:
                         ends at free + G_j, holding that forward back by max(0, end - z_j)
    serial               every reduction after the pipeline, every gather before it

The step pays, past the iteration T (the pipeline's makespan), the most any device adds:
``max over devices of max(0, reductions' end - T) + the gathers' hold`` (serial: the sums).

**Buckets** (``Buckets``, where the framework says how it cuts and launches them; Megatron-LM's
DDP and distributed optimizer, ``schedules.targets.DdpBuckets``): chunk j's collectives in
``n_j`` equal buckets. A reduce bucket k is ready when the last backward has made its share of
the gradients, ``s_j + (k + 1) / n_j (e_j - s_j)``, one bucket (n_j = 1) when that backward has
ended; the buckets go out one at a time. A gather bucket k is needed when the first forward
reaches its layers, ``a_j + k / n_j (z_j - a_j)`` (one bucket: at the forward's start); chained,
the next bucket's all-gather is dispatched only when this one is waited on (Megatron's forward
pre-hook), the first at the step's start; a bucket that ends after it is needed holds the
device's timeline back by the difference, which every later need then waits for::

    one chunk, F [0, 1], B [1, 3], R = 1.5 in 1 bucket:   reduce [3, 4.5]: 1.5 s past T
                                         in 3 buckets:   ready 1.67, 2.33, 3: ends 3 + 0.5 = 3.5
    G = 0.6 in 3 buckets, chained:  bucket 0 [0, .2], needed at 0: holds the forward .2;
                                    bucket 1 [.2, .4] before its need 1/3 + .2; bucket 2,
                                    dispatched then, [.53, .73] before 2/3 + .2: hold .2

    one chunk, one micro-batch:  F [0, 1]  B [1, 3]  T = 3
    R = 1.5, overlapped:         reduce [1, 3]: max(3, 1 + 1.5) = 3, nothing sticks out
    R = 3,   overlapped:         reduce [1, 4]: 1 s past T
    R = 3,   serial:             3 s past T
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autopipe.simulate import simcore
from autopipe.simulate.events import CompiledSchedule, StageCost, cost_arrays

__all__ = ["Buckets", "ChunkWindows", "chunk_windows", "exposed_s"]

_F, _B, _W = 0, 1, 2  # CompiledSchedule.kind


@dataclass(frozen=True)
class ChunkWindows:
    """When each chunk's first forward and last gradient-making backward ran, and on which device."""

    device: tuple[int, ...]  # per chunk: the device that runs it
    first_forward: tuple[tuple[float, float], ...]  # per chunk: (start, end)
    last_backward: tuple[tuple[float, float], ...]  # per chunk: (start, end)
    iteration_s: float  # the makespan


@dataclass(frozen=True)
class Buckets:
    """How each chunk's once-a-step collectives are cut and launched (module docstring)."""

    reduce: tuple[int, ...]  # per chunk: buckets of its reduction (1: launched as its last backward ends)
    gather: tuple[int, ...]  # per chunk: buckets of its all-gather
    chained: bool = True  # each all-gather dispatched when the one before is waited on (Megatron's pre-hook)


def chunk_windows(c: CompiledSchedule, costs: Sequence[StageCost], comm_s: Sequence[float] = ()) -> ChunkWindows:
    """Simulate ``c`` with ``costs`` per chunk and ``comm_s`` per boundary; each chunk's windows."""
    n = c.num_stages
    table, link = cost_arrays(n, [costs], [comm_s])
    iteration, _, start, end = simcore.run(
        c.rank, c.duration, c.deps, c.hop, table.reshape(1, 8 * n), link, c.ranks, starts=True
    )
    stage, kind = np.asarray(c.stage), np.asarray(c.kind)
    chunks = np.arange(n)

    def pick(mask: np.ndarray, key: np.ndarray, last: bool) -> tuple[tuple[float, float], ...]:
        st, k, s0, e0 = stage[mask], key[mask], start[mask], end[mask]
        order = np.lexsort((k, st))  # by chunk, then by the key
        at = np.searchsorted(st[order], chunks, side="right" if last else "left") - (1 if last else 0)
        idx = order[at]
        return tuple((float(a), float(b)) for a, b in zip(s0[idx], e0[idx], strict=True))

    grads = _W if c.splits_backward else _B
    return ChunkWindows(
        c.home,
        pick(kind == _F, start, last=False),
        pick(kind == grads, end, last=True),
        float(iteration[0]),
    )


def exposed_s(
    w: ChunkWindows,
    reduce_s: Sequence[float],
    gather_s: Sequence[float],
    *,
    overlap_reduce: bool,
    overlap_gather: bool,
    buckets: Buckets | None = None,
) -> float:
    """Seconds the step pays past the iteration for each chunk's ``reduce_s`` and ``gather_s``
    (module docstring): the most any device adds; ``buckets`` None: the collectives stream with
    the gradients and weights layer by layer, the gathers queued from the step's start."""
    worst = 0.0
    for d in sorted(set(w.device)):
        mine = [j for j, x in enumerate(w.device) if x == d]
        if overlap_reduce:
            by_end = sorted(mine, key=lambda j: w.last_backward[j][1])
            free = _reduced(w, reduce_s, by_end, buckets) if buckets is not None else 0.0
            for j in by_end if buckets is None else ():
                s, e = w.last_backward[j]
                free = max(e, max(free, s) + reduce_s[j])
            out = max(0.0, free - w.iteration_s)
        else:
            out = sum(reduce_s[j] for j in mine)
        if overlap_gather:
            by_start = sorted(mine, key=lambda j: w.first_forward[j][0])
            out += _chained(w, gather_s, by_start, buckets) if buckets is not None and buckets.chained else 0.0
            free, hold = 0.0, 0.0
            for j in by_start if buckets is None or not buckets.chained else ():
                free += gather_s[j]
                hold = max(hold, free - w.first_forward[j][1])
            out += hold
        else:
            out += sum(gather_s[j] for j in mine)
        worst = max(worst, out)
    return worst


def _reduced(w: ChunkWindows, reduce_s: Sequence[float], chunks: Sequence[int], buckets: Buckets) -> float:
    """When one device's reductions end, bucket by bucket (module docstring), ``chunks`` in order.
    A chunk's n buckets of R / n, ready at s + (k + 1)(e - s) / n, one after another from ``free``,
    end at the latest of free + R (never waiting), s + (e - s) / n + R (waiting for the first
    only) and e + R / n (for the last): the readiness grows linearly in k, so the k between do
    not bind, and the n buckets cost one step."""
    free = 0.0
    for j in chunks:
        s, e = w.last_backward[j]
        n, r = max(buckets.reduce[j], 1), reduce_s[j]
        free = max(free + r, s + (e - s) / n + r, e + r / n)
    return free


def _chained(w: ChunkWindows, gather_s: Sequence[float], chunks: Sequence[int], buckets: Buckets) -> float:
    """How long one device's chained all-gathers hold its timeline back (module docstring). In a
    chunk's n buckets of g = G / n against f = (z - a) / n of forward each: the first, dispatched
    when the one before was waited on, holds the forward until it ends; each later one is
    dispatched as its predecessor's layers start and needed f later, so it adds g - f where the
    gather is the slower. The next chunk's first is dispatched as this chunk's last layers start."""
    hold, dispatch = 0.0, 0.0
    for j in chunks:
        a, z = w.first_forward[j]
        n = max(buckets.gather[j], 1)
        g, f = gather_s[j] / n, (z - a) / n
        hold = max(hold, dispatch + g - a) + (n - 1) * max(0.0, g - f)
        dispatch = a + (n - 1) * f + hold
    return hold
