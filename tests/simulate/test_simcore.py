"""The simulator's core: the C extension and its Python twin give the same compiled schedule and
the same numbers (to the last bit) on seeded random schedules, agree with the event simulator,
and refuse bad schedules with the same ScheduleError (each test on both paths: the
``native_and_python`` fixture, tests/conftest.py)."""

from __future__ import annotations

import importlib
import random

import numpy as np
import pytest

from autopipe import native
from autopipe.errors import ScheduleError
from autopipe.schedules import parse_schedule, schedule_names, schedule_spec
from autopipe.schedules.lists import from_schedule, rank_array
from autopipe.simulate.events import (
    CompiledSchedule,
    StageCost,
    compile_lists,
    compile_schedule,
    simulate,
    simulate_many,
    simulate_summary,
)


def random_costs(n: int, rng: random.Random) -> list[StageCost]:
    out = []
    for _ in range(n):
        f, b, w, act = rng.uniform(0, 2), rng.uniform(0, 3), rng.uniform(0, 1), rng.uniform(1, 100)
        out.append(StageCost(f, b + w, b, w, act, act * rng.random(), rng.choice([0.0, act]), rng.uniform(0, 1e3)))
    return out


def cases(count: int) -> list[tuple[str, int, int, int, int]]:
    """Seeded (schedule, S, m, v, seed): every schedule, S <= 8, m <= 32."""
    rng, out = random.Random(13), []
    for name in schedule_names():
        spec = schedule_spec(name)
        for k in range(count):
            s = rng.randint(1 if not spec.takes_virtual else 2, 8)
            v = rng.choice([c for c in spec.virtual_choices if c > 1] or [1])
            m = rng.randint(spec.least_micro_batches(s), 32)
            if spec.micro_batches_multiple_of_devices:
                m = max(s, m - m % s)
            out.append((name, s, m, v, 100 * len(out) + k))
    return out


def here_and_in_python(fn: object) -> tuple[object, object]:
    """``fn()`` on the path under test, and with the Python twins."""
    assert callable(fn)
    here = fn()
    with native.python_twins():
        return here, fn()


def arrays(c: CompiledSchedule) -> list[list[object]]:
    fields = (
        c.rank,
        c.stage,
        c.kind,
        c.split,
        c.deps,
        c.hop,
        c.duration,
        c.rows,
        c.offsets,
        c.home_array,
        *c.rank_lists,
    )
    return [[c.ranks, c.num_stages, c.home, c.splits_backward], *(x.tolist() for x in fields)]


@pytest.mark.parametrize(("name", "s", "m", "v", "seed"), cases(2))
def test_c_and_python_compile_and_simulate_alike_and_as_simulate_does(
    name: str, s: int, m: int, v: int, seed: int, native_and_python: str
) -> None:
    spec, rng = schedule_spec(name), random.Random(seed)
    lists = spec.lists(s, m, v)
    n = s * v
    costs = [random_costs(n, rng) for _ in range(3)]
    comms = [[rng.uniform(0, 0.5) * rng.choice([0, 1]) for _ in range(n - 1)] for _ in range(3)]
    c_here, c_py = here_and_in_python(lambda: compile_lists(lists, s, v, spec.placement))
    assert isinstance(c_here, CompiledSchedule) and isinstance(c_py, CompiledSchedule)
    assert arrays(c_here) == arrays(c_py)
    here, py = here_and_in_python(lambda: simulate_many(c_py, costs, comms))
    assert here == py  # iteration, bubble, busy time, peaks: equal, not close
    assert isinstance(here, list)
    schedule = spec.create_schedule(s, m, v)
    for cost, comm, got in zip(costs, comms, here, strict=True):
        assert simulate_summary(c_py, cost, comm) == got  # one at a time = K at once
        want = simulate(schedule, cost, comm, devices=s, placement=spec.placement)
        assert got.iteration_s == pytest.approx(want.iteration_s, rel=1e-12)
        assert got.bubble_fraction == pytest.approx(want.bubble_fraction, rel=1e-9, abs=1e-12)
        assert got.rank_busy_s == pytest.approx(want.rank_busy_s, rel=1e-12)
        assert got.peak_memory_bytes == want.peak_memory_bytes


BAD = {
    "deadlock": {0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F1", "1B1", "1F0", "1B0"]},
    "missing B": {0: ["0F0", "0B0"], 1: ["1F0"]},
    "twice": {0: ["0F0", "0B0", "0F0"], 1: ["1F0", "1B0"]},
    "misplaced": {0: ["0F0", "1F0", "1B0", "0B0"], 1: []},
    "some W": {0: ["0F0", "0B0", "0W0", "0F1", "0B1"], 1: ["1F0", "1B0", "1F1", "1B1"]},
    "m gap": {0: ["0F0", "0B0", "0F5", "0B5"], 1: ["1F0", "1B0", "1F5", "1B5"]},
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_schedule_gets_the_validators_error_on_either_path(case: str, native_and_python: str) -> None:
    schedule = parse_schedule(BAD[case])
    with pytest.raises(ScheduleError) as want:
        simulate(schedule, [StageCost(1.0, 2.0, 1.0, 1.0, 1.0)] * 2, devices=2)
    with pytest.raises(ScheduleError) as got:
        compile_schedule(schedule, 2)
    assert str(got.value) == str(want.value)
    with pytest.raises(ScheduleError) as from_lists:
        compile_lists(from_schedule(schedule, 2), 2)
    assert str(from_lists.value).splitlines()[0] == str(want.value).splitlines()[0]


def test_lists_the_validator_cannot_read_are_refused_in_one_line(native_and_python: str) -> None:
    with pytest.raises(ScheduleError, match=r"^rank 1 has an action of kind 7; kinds are 0 F, 1 B, 2 W$"):
        compile_lists((rank_array([(0, 0, 0), (0, 1, 0)]), rank_array([(1, 0, 0), (1, 7, 0)])), 2)
    with pytest.raises(ScheduleError, match=r"^schedule is incomplete: 4 actions, expected"):
        compile_lists((rank_array([(0, 0, 0), (0, 1, 10**15)]), rank_array([(1, 0, 0), (1, 1, 0)])), 2)
    with pytest.raises(ScheduleError, match=r"^the lists have 1 ranks, expected one per device \(2\)$"):
        compile_lists((rank_array([(0, 0, 0)]),), 2)
    with pytest.raises(ScheduleError, match="without actions"):
        compile_lists((rank_array([]), rank_array([])), 2)
    c = compile_lists(schedule_spec("1f1b").lists(2, 2), 2)
    with pytest.raises(ScheduleError, match=r"one entry per virtual stage \(2\), got 1"):
        simulate_summary(c, [StageCost(1.0, 2.0, 1.0, 1.0, 1.0)])
    with pytest.raises(ScheduleError, match=r"one entry per stage boundary, 1 for 2 virtual stages \(got 3\)"):
        simulate_summary(c, [StageCost(1.0, 2.0, 1.0, 1.0, 1.0)] * 2, [0.1, 0.1, 0.1])


@pytest.mark.skipif(not native.available(native.SIMULATOR), reason="the C core is not built")
def test_the_extension_checks_buffer_sizes_instead_of_reading_past_them() -> None:
    from autopipe.simulate import _simcore

    one, i32, none = np.zeros(1, np.int64), np.zeros(1, np.int32), np.full(2, -1, np.int32)
    with pytest.raises(ValueError, match="offsets has 8 bytes, expected 24"):
        _simcore.order(
            np.zeros(3, np.int64), one, one, 2, 1, 1, False, i32, i32, i32, none, none, i32, i32, np.zeros(1, np.bool_)
        )
    with pytest.raises(ValueError, match="dep has 4 bytes, expected 8"):
        _simcore.run(
            i32, i32, i32, none, np.zeros(8), np.zeros(0), 1, 1, np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1)
        )
    with pytest.raises(ValueError, match="an index is out of range"):  # dur 9 of 8 durations
        _simcore.run(
            i32, i32 + 9, none, none, np.zeros(8), np.zeros(0), 1, 1, np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1)
        )
    with pytest.raises(ValueError, match="costs has 8 bytes, expected 64"):
        _simcore.memory(np.zeros(3, np.int64), np.array([0, 1]), one, False, np.zeros(1), 1, 1, np.zeros(1))


def test_the_environment_switches_the_c_core_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOPIPE_NO_SIMCORE", "1")
    try:
        importlib.reload(native)
        assert not native.enabled() and not native.in_use(native.SIMULATOR)
        c = compile_lists(schedule_spec("zb-h1").lists(3, 4), 3)  # the Python loops
        assert simulate_summary(c, [StageCost(1.0, 2.0, 1.0, 1.0, 1.0)] * 3).iteration_s == pytest.approx(
            3 * 4 + 3 - 1
        )  # ZB-H1: 3m + S - 1
    finally:
        monkeypatch.delenv("AUTOPIPE_NO_SIMCORE")
        importlib.reload(native)
    assert native.enabled() and native.in_use(native.SIMULATOR) == native.available(native.SIMULATOR)
