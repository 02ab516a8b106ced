"""ZB-V, the V-shaped Zero Bubble schedule (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024, section 6; Qi et al., "Pipeline Parallelism with Controllable Memory", NeurIPS
2024, where it is the V-ZB building block).

The model is cut into ``2S`` chunks placed in a V (:func:`~autopipe.schedules.action.v_shape`):
device ``d`` runs chunk ``d`` on the way down and chunk ``2S-1-d`` on the way back, so the
first and the last chunk share device 0 and the turn (chunks ``S-1``, ``S``) needs no hop.
The backward is split into ``B`` (input-grad) and ``W`` (weight-grad). Device ``d`` (down
chunk ``a = d``, up chunk ``b = 2S-1-d``) runs:

1. ``2(S-d)-1`` forwards of ``a``;
2. ``d`` times ``F(b) F(a)``;
3. ``S-d`` times ``F(b) B(b) W(b)``;
4. steady state: ``F(a) B(a) W(a) F(b) B(b) W(b)`` until every forward has run;
5. cool-down: ``d`` times ``B(a) B(b)``, ``S-d`` times ``B(a) W(a)``, then the pending Ws.

This is the list ``torch.distributed.pipelining.ScheduleZBVZeroBubble`` builds,
written out again here; like torch it is laid out for ``max(m, 2S-1)`` micro-batches and the
actions of the padding micro-batches are dropped, so every ``m >= 1`` is handled, ``m < S``
included (fewer micro-batches only leave a longer warm-up and cool-down bubble).

``S=2, m=4``, the lists in order (not timed)::

    rank 0 | 0F0 0F1 0F2 3F0 3B0 3W0 3F1 3B1 3W1 0F3 0B0 0W0 3F2 3B2 3W2 0B1 0W1 3F3 ...
    rank 1 | 1F0 2F0 1F1 2F1 2B0 2W0 1F2 1B0 1W0 2F2 2B1 2W1 1F3 1B1 1W1 2F3 2B2 2W2 ...

Memory: device ``d`` holds at most ``min(m, 2S-d)`` micro-batches on its down chunk and
``min(m, d+1)`` on its up chunk (:func:`inflight`), but never both peaks at once: at worst
``2S`` chunk activations (for ``m >= 2S``), which with chunks of half a stage is 1F1B's
peak ``S`` stage activations, on every device (1F1B only reaches it on device 0) — the
paper's "same memory as 1F1B".

Bubble: with every F, B and W of a chunk taking one unit (a device's work ``6m`` units), the
last device cannot start before ``S-1`` chunk forwards have crossed the down leg, so no
schedule beats ``6m + S - 1``; ZB-V reaches it once ``m >= (3S-1)/2`` and in general takes
``6m + S - 1 + max(0, 3S-1-2m)`` (:func:`makespan_units`, checked against the simulator for
every ``S <= 8``, ``m <= 32``). The papers' "zero bubble" for ``T_F = T_B = T_W`` is this:
in steady state no device idles, and what is left is the ``S-1``-unit ramp, bubble
``(S-1)/(6m+S-1)`` (:func:`bubble`), about half of ZB-H1's ``(S-1)/(3m+S-1)`` at the same stage
times (a stage is two chunks).

Searched like the others: the planner cuts ``2S`` chunks for the V (chunk ``j`` and chunk
``2S-1-j`` on device ``j``, so the embedding and the LM head share device 0) and every split it
keeps is priced by the simulator, whose per-device peak — both chunks, in this order of
actions — decides what fits (``autopipe/planner/exact.py``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from autopipe.errors import ScheduleError
from autopipe.schedules.action import Schedule, v_shape
from autopipe.schedules.lists import B, F, RankLists, W, tiled, to_schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.validate import check_sizes

__all__ = [
    "SPEC",
    "bubble",
    "create_lists",
    "create_schedule",
    "inflight",
    "makespan_units",
    "rank_rows",
]


def rank_rows(rank: int, devices: int, micro_batches: int) -> npt.NDArray[np.int64]:
    """The ZB-V list of device ``rank`` (chunks ``rank`` and ``2S-1-rank``) as
    ``(stage, kind, micro-batch)`` rows: steps 1-5 of the module docstring laid out for
    ``n = max(m, 2S-1)`` micro-batches — the steady state of step 4 is ``n-2S+d+1`` rounds
    ``F(a) B(a) W(a) F(b) B(b) W(b)`` then ``S-d-1`` without ``F(a)`` (its forwards done) —
    and the padding micro-batches dropped."""
    S, d, n = devices, rank, max(micro_batches, 2 * devices - 1)
    a, b = 3 * d, 3 * (2 * S - 1 - d)  # codes of the down and the up chunk
    rows = tiled(
        ((a + F,), 2 * (S - d) - 1),
        ((b + F, a + F), d),
        ((b + F, b + B, b + W), S - d),
        ((a + F, a + B, a + W, b + F, b + B, b + W), n - 2 * S + d + 1),
        ((a + B, a + W, b + F, b + B, b + W), S - d - 1),
        ((a + B, b + B), d),
        ((a + B, a + W), S - d),
        ((b + W,), d),
        ((a + W,), d),
    )
    return rows if n == micro_batches else rows[rows[:, 2] < micro_batches]


def create_lists(devices: int, micro_batches: int, virtual: int = 2) -> RankLists:
    """The ZB-V schedule as integer arrays: :func:`rank_rows` of every device; chunk ``j`` on
    device :func:`~autopipe.schedules.action.v_shape` ``(j, S)``."""
    check_sizes(devices, micro_batches, virtual)
    if virtual != 2:
        raise ScheduleError(f"zb-v runs two chunks per device in a V (got virtual: {virtual}); use virtual=2")
    return tuple(rank_rows(d, devices, micro_batches) for d in range(devices))


def create_schedule(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """:func:`create_lists` as Actions."""
    return to_schedule(create_lists(devices, micro_batches, virtual))


def inflight(devices: int, micro_batches: int, virtual: int = 2) -> tuple[float, ...]:
    """Per chunk ``j``, the most micro-batches whose activations it holds (F done, B not):
    ``min(m, 2S-j)``, as 1F1B over ``2S`` stages (down chunk ``d`` of device ``d``: ``2S-d``;
    its up chunk ``2S-1-d``: ``d+1``). The
    two peaks never coincide: a device holds at most ``min(2S, ...)`` chunk activations, one
    fewer than their sum once ``m >= 2S`` (see the module docstring)."""
    S, m = devices, micro_batches
    return tuple(float(min(m, 2 * S - j)) for j in range(2 * S))


def makespan_units(devices: int, micro_batches: int) -> int:
    """Iteration time in units when every F, B and W of a chunk takes one unit:
    ``6m + S - 1`` (a device's work plus the down-leg ramp), plus ``3S - 1 - 2m`` more when
    ``m < (3S-1)/2`` (too few micro-batches to fill the warm-up and cool-down)."""
    S, m = devices, micro_batches
    return 6 * m + S - 1 + max(0, 3 * S - 1 - 2 * m)


def bubble(devices: int, micro_batches: int, virtual: int = 2) -> float:
    """``1 - 6m / makespan_units``: ``(S-1) / (6m+S-1)`` once ``m >= (3S-1)/2``, when F, B
    and W take equal time."""
    return 1.0 - 6 * micro_batches / makespan_units(devices, micro_batches)


SPEC = ScheduleSpec(
    name="zb-v",
    create_schedule=create_schedule,
    create_lists=create_lists,
    inflight=inflight,
    bubble=bubble,
    torch_class="ScheduleZBVZeroBubble",
    preference=4,
    torch_multi=True,
    splits_backward=True,
    virtual_choices=(2,),
    placement=v_shape,
)
