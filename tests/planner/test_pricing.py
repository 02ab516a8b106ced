"""The search's fast pricing of a candidate equals the event simulator."""

from __future__ import annotations

import random

import pytest

from autopipe.planner.pricing import compiled
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
