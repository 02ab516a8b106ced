"""DualPipeV, DeepSeek's DualPipe cut in half (DeepSeek-AI, "DeepSeek-V3 Technical Report",
2024, section 3.2.1; deepseek-ai/DualPipe ``dualpipev.py``; torch's ``ScheduleDualPipeV``).

The model is cut into ``2S`` chunks placed in a V (:func:`~autopipe.schedules.action.v_shape`):
device ``d`` runs chunk ``a = d`` on the way down and ``b = 2S-1-d`` on the way back. Its
steady state runs the forward of one chunk *together with* the backward of the other, on
different micro-batches (an overlapped pair, ``F&B``). Device ``d`` runs:

1. ``2(S-d-1)`` forwards of ``a``;
2. ``d+1`` times ``F(a) F(b)``;
3. ``S-d-1`` times ``B(b) W(b) F(b)`` (zero bubble: the weight-grad right after);
4. ``m-2S+d+1`` times the pairs ``F(a)&B(b)``, ``F(b)&B(a)`` (the first ``F(a)``, ``B(b)`` of
   the last device are not overlapped, to shorten the bubble, as DeepSeek and torch do);
5. ``S-d-1`` times ``B(b)``, ``F(b)&B(a)``;
6. ``d+1`` times ``B(b) B(a)``, from its middle on with the weight-grad deferred;
7. ``S-d-1`` times a deferred ``W``, then ``B(a)`` (weight-grad deferred);
8. the ``d+1`` deferred ``W``.

This is the list ``ScheduleDualPipeV`` builds, written out again here. One representation
choice: DualPipeV mixes full backwards with split ones (only the cool-down defers W), while an
autopipe schedule splits all its backwards or none; a full backward is written ``B`` with its
``W`` right after it, which is the same computation.

An overlapped pair is ``F(x, i)`` immediately followed in the list by ``B(y, k)`` (and its
``W``) of the other chunk: :func:`overlapped` names them; they stay ordinary actions, so the
validator, simulator, replay, executor and pictures read them as they are.

Pricing rule: a pair costs ``F + B`` (+ ``W``) of compute on its device, run one after the
other, and its sends and receives overlap compute (receives posted early, sends not waited
for): exactly how the simulator prices any two adjacent actions, so it needs no new rule.
What DualPipe hides on GPUs is the expert-parallel all-to-all of one chunk behind the compute
of the other; autopipe models no communication inside a chunk and its CPU executor computes
serially, so the pair gains nothing over ``F`` then ``B`` here. Checked against the executor:
``bench/bench_dualpipe_overlap.py`` times pairs against lone ``F`` and ``B`` of the same chunks.

Needs ``m >= 2S`` (DeepSeek's ``num_chunks >= num_ranks * 2``, torch's ``n_microbatches >=
num_stages``); fewer is refused with one line.

``S=2, m=4``, the lists in order (not timed; ``[...]`` marks an overlapped pair, with the W
of its full backward)::

    rank 0 | 0F0 0F1 0F2 3F0 3B0 3W0 3F1 [0F3 3B1 3W1] [3F2 0B0 0W0] 3B2 3W2 [3F3 0B1 0W1]
             3B3 3W3 0B2 0W2 0B3 0W3
    rank 1 | 1F0 2F0 1F1 2F1 1F2 2B0 2W0 [2F2 1B0 1W0] [1F3 2B1 2W1] [2F3 1B1 1W1]
             2B2 2W2 1B2 1W2 2B3 1B3 2W3 1W3      (1F2 2B0: the turn, not overlapped)

Memory: chunk ``j`` holds at most ``2S-j`` micro-batches (:func:`inflight`, as 1F1B over
``2S`` stages; ``m >= 2S`` always fills it), and unlike ZB-V device ``d`` reaches both its
chunks' peaks at once: ``(2S-d) + (d+1) = 2S+1`` chunk activations on every device, one more
than ZB-V's ``2S`` — DeepSeek's "PP+1" for ``PP = 2S`` stages (checked against the simulator).

Bubble: with every F, B (input-grad) and W of a chunk taking one unit (a full backward two, a
pair three), every device does ``6m`` units and the last device cannot start before ``S-1``
forwards have crossed the down leg, so no schedule on the V beats ``6m + S - 1``; DualPipeV
reaches it for every ``m >= 2S`` (:func:`makespan_units`, the simulator's value for every
``S <= 8``, ``2S <= m <= 32``), bubble ``(S-1)/(6m+S-1)`` (:func:`bubble`), ZB-V's.
DeepSeek's table (``(PP/2-1)(F&B+B-3W)``, ``F&B`` the time of a pair) gains where ``F&B <
F+B``, which needs communication inside a chunk to hide (expert-parallel all-to-all); with
``F&B = F+B`` (this pricing) DualPipeV ties ZB-V in time and holds one more chunk of
activations per device.

Registered and searched (at m >= 2S only); ``--schedule dualpipe-v`` pins it.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt

from autopipe.schedules.action import Action, Schedule, v_shape
from autopipe.schedules.lists import B, F, RankLists, W, tiled, to_actions, to_schedule
from autopipe.schedules.spec import ScheduleSpec
from autopipe.schedules.v_shapes import v_block

__all__ = [
    "SPEC",
    "bubble",
    "create_lists",
    "create_schedule",
    "inflight",
    "least_micro_batches",
    "makespan_units",
    "overlapped",
    "rank_actions",
    "rank_rows",
]

PER_DEVICE = v_block.PER_DEVICE  # at least 2 micro-batches per device, one per chunk (v_block.check refuses fewer)


def least_micro_batches(devices: int) -> int:
    """The fewest micro-batches DualPipeV runs on ``devices``: ``2S`` (one per chunk)."""
    return PER_DEVICE * devices


def _parts(rank: int, devices: int, micro_batches: int) -> tuple[list[tuple[list[int], int]], list[int]]:
    """Device ``rank``'s list as :func:`~autopipe.schedules.lists.tiled` parts of codes
    ``3 * chunk + kind`` (steps 1-8 of the module docstring; a full backward is ``B`` then its
    ``W``), and the positions of the F of each overlapped pair."""
    S, m, d = devices, micro_batches, rank
    a, b = 3 * d, 3 * (2 * S - 1 - d)  # codes of the down and the up chunk
    rounds = m - 2 * S + d + 1  # step 4: pairs F(a)&B(b), F(b)&B(a)
    parts = [
        ([a + F], 2 * (S - d - 1)),
        ([a + F, b + F], d + 1),
        ([b + B, b + W, b + F], S - d - 1),
        ([a + F, b + B, b + W, b + F, a + B, a + W], rounds),
        ([b + B, b + W, b + F, a + B, a + W], S - d - 1),
    ]
    at = 2 * (S - d - 1) + 2 * (d + 1) + 3 * (S - d - 1)
    pairs = [at + 6 * i + half for i in range(max(0, rounds)) for half in (0, 3)]
    if d == S - 1 and rounds > 0:
        pairs.pop(0)  # the turn: not overlapped, a shorter bubble
    at += 6 * max(0, rounds)
    pairs += [at + 5 * i + 2 for i in range(S - d - 1)]
    tail: list[int] = []
    deferred: deque[int] = deque()  # Ws of backwards split in the cool-down, oldest first

    def backward(chunk: int, split: bool) -> None:
        tail.append(chunk + B)
        (deferred if split else tail).append(chunk + W)

    split = False
    for i in range(d + 1):  # step 6
        if i == (d + 1) // 2 and d % 2 == 1:
            split = True
        backward(b, split)
        if i == (d + 1) // 2 and d % 2 == 0:
            split = True
        backward(a, split)
    for _ in range(S - d - 1):  # step 7
        if deferred:
            tail.append(deferred.popleft())
        backward(a, split)
    tail += deferred  # step 8
    return [*parts, (tail, 1)], pairs


def rank_rows(rank: int, devices: int, micro_batches: int) -> npt.NDArray[np.int64]:
    """The DualPipeV list of device ``rank`` (chunks ``rank`` and ``2S-1-rank``) as
    ``(stage, kind, micro-batch)`` rows."""
    return tiled(*_parts(rank, devices, micro_batches)[0])


def rank_actions(rank: int, devices: int, micro_batches: int) -> list[Action]:
    """:func:`rank_rows` as Actions."""
    return to_actions(rank_rows(rank, devices, micro_batches))


def overlapped(rank: int, devices: int, micro_batches: int) -> tuple[tuple[Action, Action], ...]:
    """The overlapped pairs ``(F(x, i), B(y, k))`` of device ``rank``, in list order; each F is
    immediately followed by its B in :func:`rank_actions`."""
    parts, pairs = _parts(rank, devices, micro_batches)
    actions = to_actions(tiled(*parts))
    return tuple((actions[p], actions[p + 1]) for p in pairs)


def create_lists(devices: int, micro_batches: int, virtual: int = 2) -> RankLists:
    """The DualPipeV schedule as integer arrays: :func:`rank_rows` of every device; chunk ``j``
    on device :func:`~autopipe.schedules.action.v_shape` ``(j, S)``."""
    v_block.check("dualpipe-v", devices, micro_batches, virtual)
    return tuple(rank_rows(d, devices, micro_batches) for d in range(devices))


def create_schedule(devices: int, micro_batches: int, virtual: int = 2) -> Schedule:
    """:func:`create_lists` as Actions: ``{rank: rank_actions(rank, devices, micro_batches)}``."""
    return to_schedule(create_lists(devices, micro_batches, virtual))


def inflight(devices: int, micro_batches: int, virtual: int = 2) -> tuple[float, ...]:
    """Per chunk ``j``, the most micro-batches whose activations it holds (F done, B not):
    ``2S-j`` (the warm-up of steps 1-2 runs ``2S-1-d`` forwards of down chunk ``d`` before its
    first B, one more before that B; up chunk ``2S-1-d`` holds ``d+1``). Both chunks of a
    device peak together: ``2S+1`` chunk activations per device (module docstring)."""
    v_block.check("dualpipe-v", devices, micro_batches, virtual)
    return tuple(float(2 * devices - j) for j in range(2 * devices))


def makespan_units(devices: int, micro_batches: int) -> int:
    """Iteration time in units when every F, B (input-grad) and W of a chunk takes one unit:
    ``6m + S - 1``, a device's work plus the down-leg ramp, for every ``m >= 2S``."""
    v_block.check("dualpipe-v", devices, micro_batches, 2)
    return 6 * micro_batches + devices - 1


def bubble(devices: int, micro_batches: int, virtual: int = 2) -> float:
    """``1 - 6m / makespan_units``, when F, B and W take equal time."""
    return 1.0 - 6 * micro_batches / makespan_units(devices, micro_batches)


SPEC = ScheduleSpec(
    name="dualpipe-v",
    create_schedule=create_schedule,
    create_lists=create_lists,
    inflight=inflight,
    bubble=bubble,
    torch_class="ScheduleDualPipeV",
    preference=7,
    torch_multi=True,
    splits_backward=True,
    virtual_choices=(2,),
    placement=v_shape,
    searched=True,
    min_micro_batches_per_device=PER_DEVICE,
    overlapped=overlapped,
)
