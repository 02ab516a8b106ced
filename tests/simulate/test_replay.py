"""The fast replay gives simulate's Timeline exactly, and refuses what simulate refuses."""

from __future__ import annotations

import random

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import make_schedule, parse_schedule, schedule_names, schedule_spec
from autopipe.simulate.events import StageCost, compile_schedule, simulate, simulate_summary
from autopipe.simulate.replay import replay


def random_costs(n: int, seed: int) -> list[StageCost]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        f, b, w = rng.uniform(0, 2), rng.uniform(0, 3), rng.uniform(0, 1)
        act = rng.uniform(1, 100)
        out.append(
            StageCost(
                f,
                b + w,
                b,
                w,
                act,
                weight_grad_bytes=act * rng.random(),
                transient_bytes=rng.choice([0.0, act]),
                static_bytes=rng.uniform(0, 1e3),
            )
        )
    return out


@pytest.mark.parametrize("name", schedule_names())
@pytest.mark.parametrize(("s", "m", "seed"), [(1, 1, 0), (2, 3, 1), (3, 6, 2), (4, 8, 3), (5, 7, 4)])
def test_replay_is_simulate_number_for_number(name: str, s: int, m: int, seed: int) -> None:
    spec = schedule_spec(name)
    v = 2 if spec.takes_virtual and (s > 1 or spec.virtual_choices == (2,)) else 1  # zb-v: always 2
    if spec.micro_batches_multiple_of_devices and m % s:
        m = s * 2
    m = max(m, spec.least_micro_batches(s))
    schedule = make_schedule(name, s, m, v)
    costs = random_costs(s * v, seed)
    comm = [random.Random(seed).uniform(0, 0.5) for _ in range(s * v - 1)]
    want = simulate(schedule, costs, comm, devices=s, placement=spec.placement)
    have = replay(schedule, costs, comm, devices=s, virtual=v, placement=spec.placement)
    assert have == want  # every ActionTiming, the bubble, busy time and memory: equal, not close


def test_replay_refuses_a_deadlock_and_an_incomplete_schedule() -> None:
    costs = [StageCost(1.0, 2.0, 1.0, 1.0, 1.0)] * 2
    stuck = parse_schedule({0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F1", "1B1", "1F0", "1B0"]})
    with pytest.raises(ScheduleError) as info:
        replay(stuck, costs, devices=2)
    with pytest.raises(ScheduleError) as want:
        simulate(stuck, costs, devices=2)
    assert str(info.value) == str(want.value)  # the same grid, the stuck steps marked
    missing = parse_schedule({0: ["0F0", "0B0"], 1: ["1F0"]})
    with pytest.raises(ScheduleError):
        replay(missing, costs, devices=2)
    with pytest.raises(ScheduleError, match="one entry per virtual stage"):
        replay(missing, costs[:1], devices=2)


@pytest.mark.slow
def test_replay_of_64_devices_by_1536_micro_batches_agrees_with_the_fast_path() -> None:
    """ZB-H1 at the README's GPT-3 size: 294,912 actions (simulate takes about 20 s); the
    planner's own fast path (simulate_summary) agrees. How long replay takes: bench/bench_timeline.py."""
    schedule = schedule_spec("zb-h1").create_schedule(64, 1536, 1)  # trusted: no grid check
    costs = [StageCost(1.0, 2.0, 1.0, 1.0, 1.0)] * 64
    t = replay(schedule, costs, [0.01] * 63, devices=64)
    assert len(t.actions) == 64 * 1536 * 3
    summary = simulate_summary(compile_schedule(schedule, 64), costs, [0.01] * 63)
    assert (t.iteration_s, t.peak_memory_bytes) == (summary.iteration_s, summary.peak_memory_bytes)
    assert t.rank_busy_s == pytest.approx(summary.rank_busy_s, rel=1e-12)
