"""What data-parallel collectives add past a pipeline: timelines small enough to work out by hand."""

from __future__ import annotations

import random

import pytest

from autopipe.schedules import schedule_spec
from autopipe.simulate.events import StageCost, compile_lists
from autopipe.simulate.overlap import Buckets, ChunkWindows, chunk_windows, exposed_s


def _windows(name: str, devices: int, micro_batches: int, f: float, b: float, w: float = 0.0) -> ChunkWindows:
    spec = schedule_spec(name)
    compiled = compile_lists(spec.lists(devices, micro_batches, 1), devices, 1, spec.placement)
    cost = StageCost(forward_s=f, backward_s=b + w, backward_input_s=b, backward_weight_s=w, activation_bytes=0.0)
    return chunk_windows(compiled, [cost] * devices)


def test_one_stage_hides_a_reduction_shorter_than_its_backward() -> None:
    """F [0, 1], B [1, 3]: the gradients go out during B; 1.5 s of reduction ends with B, 3 s ends 1 s
    past it; serial, all 3 s come after."""
    w = _windows("1f1b", 1, 1, f=1.0, b=2.0)
    assert (w.first_forward, w.last_backward, w.iteration_s) == (((0.0, 1.0),), ((1.0, 3.0),), 3.0)
    assert exposed_s(w, [1.5], [0.0], overlap_reduce=True, overlap_gather=False) == 0.0
    assert exposed_s(w, [3.0], [0.0], overlap_reduce=True, overlap_gather=False) == pytest.approx(1.0)
    assert exposed_s(w, [3.0], [0.0], overlap_reduce=False, overlap_gather=False) == pytest.approx(3.0)


def test_the_weight_gradients_come_from_w_where_the_backward_is_split() -> None:
    """ZB-H1 on one device: F [0, 1], B [1, 2], W [2, 3]; the reduction waits for W."""
    w = _windows("zb-h1", 1, 1, f=1.0, b=1.0, w=1.0)
    assert w.last_backward == ((2.0, 3.0),)
    assert exposed_s(w, [1.5], [0.0], overlap_reduce=True, overlap_gather=False) == pytest.approx(0.5)


def test_two_stages_the_last_to_finish_pays() -> None:
    """1F1B, 2 stages, 1 micro-batch: F0 [0, 1], F1 [1, 2], B1 [2, 4], B0 [4, 6]. With 3 s of
    reduction each, stage 1's ends at 5 (hidden), stage 0's at 7: 1 s past the end."""
    w = _windows("1f1b", 2, 1, f=1.0, b=2.0)
    assert w.iteration_s == 6.0 and w.last_backward == ((4.0, 6.0), (2.0, 4.0))
    assert exposed_s(w, [3.0, 3.0], [0.0, 0.0], overlap_reduce=True, overlap_gather=False) == pytest.approx(1.0)
    # the gathers run from the step's start: stage 0's 1.5 s outlast its first forward [0, 1] by 0.5 s,
    # stage 1's end before its first forward [1, 2] does
    assert exposed_s(w, [0.0, 0.0], [1.5, 1.5], overlap_reduce=False, overlap_gather=True) == pytest.approx(0.5)
    assert exposed_s(w, [0.0, 0.0], [1.5, 1.5], overlap_reduce=False, overlap_gather=False) == pytest.approx(1.5)


def test_a_devices_chunks_share_one_stream() -> None:
    """Two chunks on one device, last backwards [2, 4] and [4, 6]: 3 s of reduction each, one after
    the other: the first from 2 to 5, the second from 5 (not 4) to 8, 2 s past the end at 6."""
    w = ChunkWindows(
        device=(0, 0), first_forward=((0.0, 1.0), (1.0, 2.0)), last_backward=((4.0, 6.0), (2.0, 4.0)), iteration_s=6.0
    )
    assert exposed_s(w, [3.0, 3.0], [0.0, 0.0], overlap_reduce=True, overlap_gather=False) == pytest.approx(2.0)
    assert exposed_s(w, [3.0, 3.0], [0.0, 0.0], overlap_reduce=False, overlap_gather=False) == pytest.approx(6.0)


def test_a_reduction_in_buckets_waits_for_each_buckets_gradients() -> None:
    """F [0, 1], B [1, 3], R = 1.5 s: in one bucket (Megatron-LM past the first pipeline rank) it
    starts as B ends, 1.5 s past it; in 3 buckets, ready at 1 + 2/3, 1 + 4/3 and 3, of 0.5 s
    each, it ends at 3.5: the last bucket's 0.5 s past the end."""
    w = _windows("1f1b", 1, 1, f=1.0, b=2.0)
    one, three = Buckets((1,), (1,)), Buckets((3,), (3,))
    assert exposed_s(w, [1.5], [0.0], overlap_reduce=True, overlap_gather=False, buckets=one) == pytest.approx(1.5)
    assert exposed_s(w, [1.5], [0.0], overlap_reduce=True, overlap_gather=False, buckets=three) == pytest.approx(0.5)
    # a slow reduction: 3 s in 3 buckets runs back to back from 1 + 2/3, ends at 4 + 2/3
    assert exposed_s(w, [3.0], [0.0], overlap_reduce=True, overlap_gather=False, buckets=three) == pytest.approx(5 / 3)


def test_chained_gathers_hold_the_forward_bucket_by_bucket() -> None:
    """F [0, 1], G = 0.6 s in 3 buckets, chained (each dispatched when the one before is waited on):
    bucket 0 [0, 0.2] is needed at 0, a 0.2 s hold; bucket 1 [0.2, 0.4] is there before its layers
    (1/3 + 0.2); bucket 2 [0.53, 0.73] before 2/3 + 0.2. In one bucket all 0.6 s hold it. Streamed
    (no buckets), the gather only has to end with the forward: nothing."""
    w = _windows("1f1b", 1, 1, f=1.0, b=2.0)
    for n, hold in ((3, 0.2), (1, 0.6)):
        buckets = Buckets((1,), (n,))
        assert exposed_s(w, [0.0], [0.6], overlap_reduce=False, overlap_gather=True, buckets=buckets) == pytest.approx(
            hold
        )
    assert exposed_s(w, [0.0], [0.6], overlap_reduce=False, overlap_gather=True) == 0.0


def test_a_chained_gather_starts_when_the_chunk_before_is_waited_on() -> None:
    """Two chunks on one device, first forwards [0, 1] and [1, 2], 1.5 s of gather each in one
    bucket: chunk 0's [0, 1.5] holds its forward 1.5 s; chunk 1's, dispatched then, [1.5, 3], is
    needed at 1 + 1.5: 0.5 s more, 2 s in all. Queued from the step's start instead (no buckets),
    they end at 1.5 and 3 against forwards ending at 1 and 2: 1 s."""
    w = ChunkWindows(
        device=(0, 0), first_forward=((0.0, 1.0), (1.0, 2.0)), last_backward=((4.0, 6.0), (2.0, 4.0)), iteration_s=6.0
    )
    chained = Buckets((1, 1), (1, 1))
    gather = [1.5, 1.5]
    assert exposed_s(w, [0, 0], gather, overlap_reduce=False, overlap_gather=True, buckets=chained) == pytest.approx(
        2.0
    )
    assert exposed_s(w, [0, 0], gather, overlap_reduce=False, overlap_gather=True) == pytest.approx(1.0)


def _bucket_by_bucket(w: ChunkWindows, reduce_s: list[float], gather_s: list[float], buckets: Buckets) -> float:
    """The module docstring's buckets, one at a time (what the closed forms of exposed_s sum up)."""
    worst = 0.0
    for d in sorted(set(w.device)):
        mine = [j for j, x in enumerate(w.device) if x == d]
        free = 0.0
        for j in sorted(mine, key=lambda j: w.last_backward[j][1]):
            s, e = w.last_backward[j]
            n = buckets.reduce[j]
            for k in range(n):
                free = max(free, s + (k + 1) / n * (e - s)) + reduce_s[j] / n
        hold, dispatch = 0.0, 0.0
        for j in sorted(mine, key=lambda j: w.first_forward[j][0]):
            a, z = w.first_forward[j]
            n = buckets.gather[j]
            for k in range(n):
                end = dispatch + gather_s[j] / n
                need = a + k / n * (z - a) + hold
                if end > need:
                    hold, need = hold + end - need, end
                dispatch = need
        worst = max(worst, max(0.0, free - w.iteration_s) + hold)
    return worst


def test_the_closed_forms_agree_with_bucket_by_bucket_on_random_timelines() -> None:
    """Seeded random devices, chunks, windows, collectives and bucket counts."""
    rng = random.Random(0)
    for _ in range(200):
        chunks = rng.randint(1, 6)
        device = tuple(rng.randint(0, 2) for _ in range(chunks))
        first, last = [], []
        for _ in range(chunks):
            a = rng.uniform(0.0, 5.0)
            first.append((a, a + rng.uniform(0.0, 2.0)))
            s = rng.uniform(3.0, 9.0)
            last.append((s, s + rng.uniform(0.0, 2.0)))
        w = ChunkWindows(device, tuple(first), tuple(last), max(e for _, e in last) + rng.uniform(0.0, 1.0))
        reduce = [rng.uniform(0.0, 3.0) for _ in range(chunks)]
        gather = [rng.uniform(0.0, 3.0) for _ in range(chunks)]
        buckets = Buckets(
            tuple(rng.randint(1, 9) for _ in range(chunks)), tuple(rng.randint(1, 9) for _ in range(chunks))
        )
        got = exposed_s(w, reduce, gather, overlap_reduce=True, overlap_gather=True, buckets=buckets)
        assert got == pytest.approx(_bucket_by_bucket(w, reduce, gather, buckets))
