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

__all__ = ["ChunkWindows", "chunk_windows", "exposed_s"]

_F, _B, _W = 0, 1, 2  # CompiledSchedule.kind


@dataclass(frozen=True)
class ChunkWindows:
    """When each chunk's first forward and last gradient-making backward ran, and on which device."""

    device: tuple[int, ...]  # per chunk: the device that runs it
    first_forward: tuple[tuple[float, float], ...]  # per chunk: (start, end)
    last_backward: tuple[tuple[float, float], ...]  # per chunk: (start, end)
    iteration_s: float  # the makespan


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
) -> float:
    """Seconds the step pays past the iteration for each chunk's ``reduce_s`` and ``gather_s``
    (module docstring): the most any device adds."""
    worst = 0.0
    for d in sorted(set(w.device)):
        mine = [j for j, x in enumerate(w.device) if x == d]
        if overlap_reduce:
            free = 0.0
            for j in sorted(mine, key=lambda j: w.last_backward[j][1]):
                s, e = w.last_backward[j]
                free = max(e, max(free, s) + reduce_s[j])
            out = max(0.0, free - w.iteration_s)
        else:
            out = sum(reduce_s[j] for j in mine)
        if overlap_gather:
            free, hold = 0.0, 0.0
            for j in sorted(mine, key=lambda j: w.first_forward[j][0]):
                free += gather_s[j]
                hold = max(hold, free - w.first_forward[j][1])
            out += hold
        else:
            out += sum(gather_s[j] for j in mine)
        worst = max(worst, out)
    return worst
