"""What a timeline picture shows: windows, elision counts, boxes, memory steps."""

from __future__ import annotations

import pytest

from autopipe.schedules import make_schedule
from autopipe.schedules.action import round_robin, v_shape
from autopipe.show.picture import (
    FULL_DETAIL,
    RECOMPUTE,
    device_chunks,
    frame,
    memory_steps,
    placement_shape,
    placement_words,
    sample,
)
from autopipe.simulate.events import StageCost, simulate


def costs(n: int) -> list[StageCost]:
    return [
        StageCost(
            1.0 + 0.1 * j,
            2.0,
            1.0,
            1.0,
            activation_bytes=10.0 + j,
            weight_grad_bytes=4.0,
            transient_bytes=3.0 * (j % 2),
            static_bytes=100.0,
        )
        for j in range(n)
    ]


def test_a_short_timeline_is_drawn_whole_with_recompute_as_its_own_kind() -> None:
    t = simulate(make_schedule("1f1b", 3, 4), costs(3), devices=3)
    f = frame(t, 3, [0, 0, 0], [0.0, 0.5, 0.0])
    assert len(f.windows) == 1 and f.elided == () and f.gap == 0.0 and f.width == t.iteration_s
    assert len(f.boxes) == len(t.actions) + 4  # stage 1's four B: R (0.5 s) then B
    r = [b for b in f.boxes if b.kind == RECOMPUTE]
    assert len(r) == 4 and all(b.stage == 1 and b.x1 - b.x0 == pytest.approx(0.5) for b in r)
    assert all(
        b.x0 == at.start_s
        for b, at in zip(
            [b for b in f.boxes if b.kind == "F"], [a for a in t.actions if a.action.kind == "F"], strict=True
        )
    )


def test_a_long_timeline_keeps_its_ends_and_counts_what_it_elides() -> None:
    s, m = 4, 400
    t = simulate(make_schedule("1f1b", s, m), costs(s), devices=s)
    f = frame(t, s, [0] * s)
    assert 2 * m > FULL_DETAIL and len(f.windows) == 3 and len(f.elided) == 2
    drawn = {(b.rank, b.stage, b.kind, b.microbatch) for b in f.boxes}
    assert len(drawn) + sum(f.elided) == len(t.actions)  # each action drawn or counted, once
    for d in range(s):
        mine = [at for at in t.actions if at.rank == d]
        for at in mine[:120] + mine[-120:]:  # warm-up and cool-down in full
            assert (d, at.action.stage, at.action.kind.value, at.action.microbatch) in drawn
        assert sum(1 for b in f.boxes if b.rank == d) < 400  # bounded by the picture, not by m
    xs = [b.x0 for b in f.boxes if b.rank == 0]
    assert xs == sorted(xs) and max(b.x1 for b in f.boxes) <= f.width + 1e-9
    assert f.x_of((f.windows[0].end_s + f.windows[1].start_s) / 2) is None  # inside the elided middle


@pytest.mark.parametrize(
    ("name", "s", "m", "v"), [("1f1b", 4, 8, 1), ("zb-h1", 4, 8, 1), ("interleaved-1f1b", 2, 4, 2), ("gpipe", 3, 5, 1)]
)
def test_memory_steps_peak_where_the_simulator_says(name: str, s: int, m: int, v: int) -> None:
    t = simulate(make_schedule(name, s, m, v), costs(s * v), devices=s)
    steps = memory_steps(t, costs(s * v), [j % s for j in range(s * v)])
    assert tuple(max(b for _, b in row) for row in steps) == t.peak_memory_bytes
    assert all(
        row[0] == (0.0, 100.0 * v) and row[-1][1] == pytest.approx(100.0 * v) for row in steps
    )  # all freed at the end
    f = frame(t, s, [j // s for j in range(s * v)])
    line = sample(f, steps[0])
    assert line[0] == (0.0, 100.0 * v) and line[-1][0] == pytest.approx(f.width)


def test_the_placement_is_read_from_where_the_chunks_are() -> None:
    v = [v_shape(j, 4) for j in range(8)]
    assert v == [0, 1, 2, 3, 3, 2, 1, 0] and placement_shape(v, 4) == "V"
    assert device_chunks(v, 4) == ((0, 7), (1, 6), (2, 5), (3, 4))
    assert placement_shape([v_shape(j, 2, 4) for j in range(8)], 2) == "zigzag"
    rr = [round_robin(j, 3) for j in range(9)]
    assert placement_shape(rr, 3) == "round-robin" and device_chunks(rr, 3) == ((0, 3, 6), (1, 4, 7), (2, 5, 8))
    assert placement_shape([0, 1, 2], 3) == "one chunk per device" and placement_words([0, 1, 2], 3) is None
    assert placement_shape([0, 0, 1, 1], 2) == "other"
    assert placement_words([0, 0, 1, 1], 2) == "other placement: device 0 runs chunks 0 and 1, device 1 runs 2 and 3"
    assert placement_words(rr, 3) == (
        "round-robin placement: device 0 runs chunks 0, 3 and 6, device 1 runs 1, 4 and 7, device 2 runs 2, 5 and 8 "
        "(chunk j on device j mod 3)"
    )
    many = placement_words([v_shape(j, 64) for j in range(128)], 64)
    assert many is not None and many.count(" runs ") == 6
    assert "device 4 runs 4 and 123, …, device 63 runs 63 and 64 (down the V on chunks 0-63, back up on 64-127" in many
