"""The event simulator: textbook bubbles, communication, memory, the Timeline value."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import Action, make_schedule, parse_schedule, schedule_spec
from autopipe.simulate.events import ActionTiming, StageCost, Timeline, simulate

TOL = 1e-9


def equal_costs(n: int, f: float, b: float, w: float = 0.0) -> list[StageCost]:
    """``n`` identical stages: forward f, input-grad b, weight-grad w, full backward b + w."""
    return [StageCost(f, b + w, b, w, activation_bytes=1.0) for _ in range(n)]


def run(name: str, s: int, m: int, v: int, f: float, b: float, w: float = 0.0) -> Timeline:
    return simulate(make_schedule(name, s, m, v), equal_costs(s * v, f, b, w), devices=s)


SMALL = [(s, m) for s in range(1, 6) for m in range(1, 9)]
TIMES = [(1.0, 2.0), (1.0, 1.0), (0.3, 0.7)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("s", "m"), SMALL)
@pytest.mark.parametrize(("f", "b"), TIMES)
def test_gpipe_1f1b_textbook(name: str, s: int, m: int, f: float, b: float) -> None:
    t = run(name, s, m, 1, f, b)
    assert t.iteration_s == pytest.approx((m + s - 1) * (f + b), abs=TOL)
    assert t.bubble_fraction == pytest.approx((s - 1) / (m + s - 1), abs=TOL)
    assert t.bubble_fraction == pytest.approx(schedule_spec(name).bubble(s, m, 1), abs=TOL)
    assert t.rank_busy_s == pytest.approx([m * (f + b)] * s, abs=TOL)


@pytest.mark.parametrize(("s", "k"), [(s, k) for s in range(1, 6) for k in (1, 2, 3)])
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize(("f", "b"), TIMES)
def test_interleaved_textbook(s: int, k: int, v: int, f: float, b: float) -> None:
    m = k * s
    t = run("interleaved-1f1b", s, m, v, f / v, b / v)
    assert t.bubble_fraction == pytest.approx((s - 1) / (v * m + s - 1), abs=TOL)
    assert t.bubble_fraction == pytest.approx(schedule_spec("interleaved-1f1b").bubble(s, m, v), abs=TOL)
    assert t.iteration_s == pytest.approx(m * (f + b) + (s - 1) * (f + b) / v, abs=TOL)


@pytest.mark.parametrize(("s", "m"), SMALL)
def test_peak_inflight(s: int, m: int) -> None:
    assert run("1f1b", s, m, 1, 1.0, 2.0).peak_inflight == tuple(min(m, s - i) for i in range(s))
    assert run("gpipe", s, m, 1, 1.0, 2.0).peak_inflight == (m,) * s


# ZB-H1, F = B = W = t, m >= S. Derived (and drawn in zb_h1.py): each rank idles (S-1)(F+B-W)
# = (S-1)t, so the iteration is 3mt + (S-1)t. 1F1B with its full backward B+W = 2t idles
# (S-1)(F+B+W) = 3(S-1)t per rank, iteration 3(m+S-1)t: ZB-H1's bubble time is exactly a third.
@pytest.mark.parametrize(("s", "m"), [(s, m) for s in range(1, 6) for m in range(s, s + 6)])
def test_zb_h1_bubble_is_a_third_of_1f1b(s: int, m: int) -> None:
    t = 0.5
    zb = run("zb-h1", s, m, 1, t, t, t)
    ob = run("1f1b", s, m, 1, t, 2 * t)
    assert zb.iteration_s == pytest.approx(3 * m * t + (s - 1) * t, abs=TOL)
    assert ob.iteration_s == pytest.approx(3 * (m + s - 1) * t, abs=TOL)
    assert zb.iteration_s - 3 * m * t == pytest.approx((ob.iteration_s - 3 * m * t) / 3, abs=TOL)
    assert zb.bubble_fraction == pytest.approx(schedule_spec("zb-h1").bubble(s, m, 1), abs=TOL)
    assert all(z <= o for z, o in zip(zb.peak_inflight, ob.peak_inflight, strict=True))


@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5)])
@pytest.mark.parametrize(("s", "m"), [(2, 2), (3, 5), (4, 4), (4, 9)])
def test_zb_h1_general_bubble(f: float, b: float, w: float, s: int, m: int) -> None:
    # The paper's (S-1)(F+B-W) per rank, which the schedule reaches when W <= F and m >= S.
    zb = run("zb-h1", s, m, 1, f, b, w)
    assert zb.iteration_s == pytest.approx(m * (f + b + w) + (s - 1) * (f + b - w), abs=TOL)


def test_zb_h1_too_few_microbatches_is_worse() -> None:
    # m < S leaves too few Ws for the tail: S=2, m=1 is the chain 0F0 1F0 1B0 0B0 0W0.
    assert run("zb-h1", 2, 1, 1, 1.0, 1.0, 1.0).iteration_s == pytest.approx(5.0, abs=TOL)


@pytest.mark.parametrize("m", [1, 2, 5])
def test_gpipe_comm_adds_two_hops(m: int) -> None:
    # F crosses the boundary once on the way in, B once on the way out; every other transfer
    # overlaps with compute when c <= f.
    c = 0.25
    schedule = make_schedule("gpipe", 2, m)
    base = simulate(schedule, equal_costs(2, 1.0, 2.0)).iteration_s
    slow = simulate(schedule, equal_costs(2, 1.0, 2.0), [c]).iteration_s
    assert slow - base == pytest.approx(2 * c, abs=TOL)


def test_1f1b_comm_two_stages_hand_timed() -> None:
    # S=2, m=3, f=b=1, comm c. Rank 1 waits for each forward, rank 0 for each gradient:
    #   rank 0: 0F0 [0,1]  0F1 [1,2]  0B0 [3+2c,4+2c]  0F2 [4+2c,5+2c]  0B1 [5+2c,6+2c]
    #           0B2 [7+4c,8+4c]
    #   rank 1: 1F0 [1+c,2+c]  1B0 [2+c,3+c]  1F1 [3+c,4+c]  1B1 [4+c,5+c]
    #           1F2 [5+3c,6+3c]  1B2 [6+3c,7+3c]
    c = 0.25
    t = simulate(make_schedule("1f1b", 2, 3), equal_costs(2, 1.0, 1.0), [c])
    spans = {str(a.action): (a.start_s, a.end_s) for a in t.actions}
    assert spans["0B0"] == pytest.approx((3 + 2 * c, 4 + 2 * c), abs=TOL)
    assert spans["1F2"] == pytest.approx((5 + 3 * c, 6 + 3 * c), abs=TOL)
    assert t.iteration_s == pytest.approx(8 + 4 * c, abs=TOL)


def test_same_rank_hops_are_free() -> None:
    # One rank with two chunks: stages 0 and 1 both on rank 0, so comm_s never applies.
    schedule = make_schedule("interleaved-1f1b", 1, 2, 2)
    costs = equal_costs(2, 1.0, 2.0)
    assert simulate(schedule, costs, [7.0]).iteration_s == pytest.approx(12.0, abs=TOL)
    assert simulate(schedule, costs).bubble_fraction == pytest.approx(0.0, abs=TOL)


def test_peak_memory_1f1b_hand_counted() -> None:
    # rank 0 runs 0F0 0F1 0B0 0B1: 100 -> 110 -> 120 -> (during 0B0: 123) -> 110 -> ... peak 123
    # rank 1 runs 1F0 1B0 1F1 1B1: 200 -> 220 -> (during 1B0: 227) -> 200 -> ... peak 227
    costs = [
        StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=10, transient_bytes=3, static_bytes=100),
        StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=20, transient_bytes=7, static_bytes=200),
    ]
    t = simulate(make_schedule("1f1b", 2, 2), costs)
    assert t.peak_memory_bytes == (123.0, 227.0)
    assert t.peak_inflight == (2, 1)


def test_peak_memory_split_backward_hand_counted() -> None:
    # ZB-H1, S=2, m=2.
    # rank 0: 0F0 0F1 0B0 0W0 0B1 0W1: 100 110 120 (B: 123) 114 110 (B: 113) 104 100 -> 123
    # rank 1: 1F0 1B0 1F1 1B1 1W0 1W1: 200 220 (B: 227) 205 225 (B: 232) 210 205 200 -> 232
    costs = [
        StageCost(1, 2, 1, 1, activation_bytes=10, weight_grad_bytes=4, transient_bytes=3, static_bytes=100),
        StageCost(1, 2, 1, 1, activation_bytes=20, weight_grad_bytes=5, transient_bytes=7, static_bytes=200),
    ]
    schedule = make_schedule("zb-h1", 2, 2)
    assert [str(a) for a in schedule[1]] == ["1F0", "1B0", "1F1", "1B1", "1W0", "1W1"]
    t = simulate(schedule, costs)
    assert t.peak_memory_bytes == (123.0, 232.0)
    assert t.peak_inflight == (2, 1)


def test_static_bytes_of_all_chunks_on_a_rank() -> None:
    costs = [StageCost(1, 1, 1, 1, activation_bytes=0, static_bytes=10 * (j + 1)) for j in range(4)]
    t = simulate(make_schedule("interleaved-1f1b", 2, 2, 2), costs)
    assert t.peak_memory_bytes == (10 + 30, 20 + 40)


def test_timeline_order_and_json() -> None:
    schedule = make_schedule("1f1b", 2, 2)
    t = simulate(schedule, equal_costs(2, 1.0, 2.0))
    assert [(a.rank, a.action) for a in t.actions] == [(r, a) for r in sorted(schedule) for a in schedule[r]]
    assert t.actions[0] == ActionTiming(Action(0, "F", 0), 0, 0.0, 1.0)
    assert json.loads(json.dumps(asdict(t)))["iteration_s"] == t.iteration_s
    assert simulate(schedule, equal_costs(2, 1.0, 2.0)) == t  # deterministic


def test_idle_slots_are_skipped() -> None:
    schedule = parse_schedule({0: ["0F0", "-", "-", "0B0"], 1: ["-", "1F0", "1B0"]})
    t = simulate(schedule, equal_costs(2, 1.0, 2.0))
    assert t.iteration_s == pytest.approx(6.0, abs=TOL)
    assert len(t.actions) == 4


def test_simulate_deadlock() -> None:
    schedule = parse_schedule({0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F0", "1F1", "1B0", "1B1"]})
    with pytest.raises(ScheduleError) as info:
        simulate(schedule, equal_costs(2, 1.0, 1.0))
    first, _, grid = str(info.value).partition("\n")
    assert first.startswith("deadlock: no rank can run its next step (rank 0 step 1: 0B0")
    assert ">0B0<" in grid


@pytest.mark.parametrize(
    ("costs", "comm", "stages", "match"),
    [
        (3, (), None, "costs must have one entry per virtual stage"),
        (0, (), None, r"a multiple of the 2 ranks \(got 0\)"),
        (2, (1.0, 2.0), None, "comm_s must have one entry per stage boundary, 1 for 2"),
        (2, (), 1, r"rank 1 is outside 0..0 \(devices: 1\)"),
    ],
)
def test_simulate_bad_sizes(costs: int, comm: tuple[float, ...], stages: int | None, match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        simulate(make_schedule("1f1b", 2, 2), equal_costs(costs, 1.0, 1.0), comm, devices=stages)


def test_bubble_formula_unknown() -> None:
    with pytest.raises(ScheduleError, match="unknown schedule 'x'"):
        schedule_spec("x").bubble(2, 2, 1)


def test_simulate_stage_on_wrong_rank() -> None:
    with pytest.raises(ScheduleError, match=r"rank 0 step 0: 1F0 belongs on rank 1"):
        simulate(parse_schedule({0: ["1F0"], 1: []}), equal_costs(2, 1.0, 1.0))


def test_simulate_incomplete_schedule() -> None:
    with pytest.raises(ScheduleError, match="1B0 is missing"):
        simulate(parse_schedule({0: ["0F0", "0B0"], 1: ["1F0"]}), equal_costs(2, 1.0, 1.0))
    with pytest.raises(ScheduleError, match="cannot simulate a schedule without actions"):
        simulate({0: []}, equal_costs(1, 1.0, 1.0))
