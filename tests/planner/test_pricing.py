"""The search's fast pricing of a candidate equals the event simulator."""

from __future__ import annotations

import random

import pytest

from autopipe.planner.pricing import compiled, with_sends
from autopipe.schedules import make_schedule
from autopipe.simulate.events import StageCost, compile_schedule, simulate, simulate_summary


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b"])
def test_fast_simulation_equals_the_event_simulator(name: str) -> None:
    rng = random.Random(7)
    S, m, v = 4, 8, (2 if name == "interleaved-1f1b" else 1)
    costs = [
        StageCost(
            rng.random(),
            rng.random() * 2,
            rng.random(),
            rng.random(),
            rng.random() * 100,
            rng.random() * 50,
            rng.random() * 10,
            rng.random() * 1000,
        )
        for _ in range(S * v)
    ]
    comm = [rng.random() * 0.1 for _ in range(S * v - 1)]
    schedule = make_schedule(name, S, m, v)
    full = simulate(schedule, costs, comm, devices=S)
    fast = simulate_summary(compile_schedule(schedule, S, v), costs, comm)
    assert fast.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    assert fast.bubble_fraction == pytest.approx(full.bubble_fraction, rel=1e-9)
    assert fast.peak_memory_bytes == pytest.approx(full.peak_memory_bytes, rel=1e-12)
    assert compiled(name, S, m, v).rank.tolist() == compile_schedule(schedule, S, v).rank.tolist()


def test_blocking_sends_cost_the_sender_and_arrive_as_it_ends() -> None:
    """GPipe on 2 stages, 1 micro-batch, 0.5 s sends: asynchronous, F0 [0, 1], F1 [1.5, 2.5], B1
    [2.5, 4.5], B0 [5, 7]; blocking, the sends are in F0 and B1 (each 0.5 s longer) and arrive as they
    end: F0 [0, 1.5], F1 [1.5, 2.5], B1 [2.5, 5], B0 [5, 7]: the same 7 s, stage 0 busy 0.5 s longer."""
    cost = StageCost(1.0, 2.0, 2.0, 0.0, 0.0)
    blocked = with_sends([cost, cost], (0.5,))
    assert (blocked[0].forward_s, blocked[0].backward_s) == (1.5, 2.0)
    assert (blocked[1].forward_s, blocked[1].backward_s, blocked[1].backward_input_s) == (1.0, 2.5, 2.5)
    schedule = compile_schedule(make_schedule("gpipe", 2, 1, 1), 2, 1)
    free = simulate_summary(schedule, [cost, cost], [0.5])
    held = simulate_summary(schedule, blocked, [])
    assert (free.iteration_s, held.iteration_s) == (7.0, 7.0)
    assert held.rank_busy_s == (3.5, 3.5) and free.rank_busy_s == (3.0, 3.0)
