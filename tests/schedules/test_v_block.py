"""V-Half and V-Min (autopipe/schedules/v_half.py, v_min.py, built by v_block.py): V placement,
validator-clean lists, in-flight memory against the simulator and the paper's table, the
makespan formulas against the simulator, the S=4 grids.

What the S=4 grids are compared with: Qi et al. (NeurIPS 2024) draw V-Min and V-Half for
4 devices as one micro-batch's building block (forwards down the V and back up, backwards
straight back, each W after its B) repeated every 6 slots. The grids below are checked to be
exactly that, slot by slot, as the simulator times them: device 0 starts with forwards of chunk
0, device 3 runs the turn (chunks 3 and 4) with no hop, and from the third block on every
device repeats its 6 actions every 6 slots with no idle slot. The paper's figure image was not
at hand offline; its table is: activation memory per device ``(p+4)//3`` (V-Min) and
``(p+2)//2`` (V-Half) micro-batches of a stage, bubble about ``2p/(3m)`` and ``p/(2m)``.
test_peak_memory_is_the_papers_table checks the first two exactly, for every S <= 8;
the bubble formulas are ours (module docstrings), V-Min's matching the paper's rate.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import one_f_one_b, schedule_names, schedule_spec, v_block, v_half, v_min
from autopipe.schedules.action import IDLE, Kind, v_shape
from autopipe.schedules.simulate import StageCost, Timeline, simulate
from autopipe.solve.request import SEARCH_SCHEDULES

MODULES = {"v-half": v_half, "v-min": v_min}
NAMES = list(MODULES)
# one chunk, F = B = W = 1; weight_grad_bytes = activation_bytes: held from F to W
UNIT = StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=1.0, weight_grad_bytes=1.0)


@cache  # several tests read the same timelines; simulate() validates each
def run(name: str, devices: int, micro_batches: int) -> Timeline:
    schedule = MODULES[name].create_schedule(devices, micro_batches)
    return simulate(schedule, [UNIT] * (2 * devices), devices=devices, placement=v_shape)


def check(name: str, S: int, m: int) -> None:
    """Validator-clean (simulate() validates), V-placed, complete; the makespan and bubble
    formulas are the simulated ones; the in-flight counts bound what the simulator holds, per
    chunk (F to B) and per device (F to W, their sum at most one above the simulated peak)."""
    module: ModuleType = MODULES[name]
    timeline = run(name, S, m)
    schedule = module.create_schedule(S, m)
    for d, actions in schedule.items():
        assert {a.stage for a in actions if a is not None} == {d, 2 * S - 1 - d}
    assert sum(len(actions) for actions in schedule.values()) == 3 * 2 * S * m
    assert abs(timeline.iteration_s - module.makespan_units(S, m)) < 1e-9, (S, m)
    assert abs(timeline.bubble_fraction - module.bubble(S, m)) < 1e-9, (S, m)
    assert timeline.iteration_s >= 6 * m + S - 1  # never below the ramp bound (zb_v.py)
    k = module.inflight(S, m, 2)
    assert all(got <= most for got, most in zip(timeline.peak_inflight, k, strict=True))
    budget = [k[d] + k[2 * S - 1 - d] for d in range(S)]
    for got, most in zip(timeline.peak_memory_bytes, budget, strict=True):
        assert most - 1 <= got <= most, (S, m)


@pytest.mark.parametrize("name", NAMES)
def test_some_sizes(name: str) -> None:
    assert MODULES[name].SPEC.devices_of(4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    for S in range(1, 9):
        for m in sorted({1, 2, S, 2 * S + 1}):  # m < S included
            check(name, S, m)


@pytest.mark.slow  # 512 simulations, ~20 s on a loaded 2-core machine
@pytest.mark.parametrize("name", NAMES)
def test_every_size_up_to_8_devices_and_32_micro_batches(name: str) -> None:
    for S in range(1, 9):
        for m in range(1, 33):
            check(name, S, m)


def test_bubbles_rank_v_min_over_v_half_over_zb_v() -> None:
    # More memory, less bubble: V-Min >= V-Half >= ZB-V's ramp, and V-Min below 1F1B's 6(S-1).
    for S in range(2, 9):
        m = 4 * S
        vmin, vhalf = v_min.makespan_units(S, m) - 6 * m, v_half.makespan_units(S, m) - 6 * m
        assert 6 * (S - 1) > vmin >= vhalf >= S - 1
    assert (v_min.makespan_units(8, 32) - 192, v_half.makespan_units(8, 32) - 192) == (27, 24)


PAPER = {"v-min": lambda S: (S + 4) // 3, "v-half": lambda S: (S + 2) // 2}  # micro-batches of a stage


@pytest.mark.parametrize("name", NAMES)
def test_peak_memory_is_the_papers_table(name: str) -> None:
    """A chunk is half a stage: 1F1B's peak is S stage activations, 2S chunk activations."""
    stage = StageCost(2.0, 4.0, 2.0, 2.0, activation_bytes=2.0)
    for S in range(2, 9):
        m = 32
        peak = max(run(name, S, m).peak_memory_bytes)  # chunk activations, F to W
        assert peak == 2 * PAPER[name](S), S
        ofob = max(simulate(one_f_one_b.create_schedule(S, m), [stage] * S).peak_memory_bytes)
        assert ofob == 2 * S
    # The ratios of the paper's title, growing S: V-Min about 1/3, V-Half about 1/2 of 1F1B.
    assert [PAPER["v-min"](S) / S for S in (8, 32, 128)] == pytest.approx([1 / 2, 12 / 32, 44 / 128])
    assert [PAPER["v-half"](S) / S for S in (8, 32, 128)] == pytest.approx([5 / 8, 17 / 32, 65 / 128])
    assert max(run("v-min", 8, 32).peak_memory_bytes) / 16 == 1 / 2  # 8 of 1F1B's 16
    assert max(run("v-half", 8, 32).peak_memory_bytes) / 16 == 5 / 8  # 10 of 16


def test_inflight_is_the_lifespan_rule() -> None:
    # V-Min, S=2: chunk 0's F in slot 0, its W ends with slot 8: ceil(9/6) = 2 micro-batches;
    # chunk 3 (the last, on device 0 too): F in slot 3, B in 4, W in 5: ceil(3/6) = 1.
    slots = v_block.block(2, v_min.GAPS)
    assert (slots[0, Kind.FORWARD], slots[0, Kind.WEIGHT] + 1) == (0, 9)
    assert [slots[3, kind] for kind in Kind] == [3, 4, 5]
    assert v_min.inflight(2, 32) == (2.0, 2.0, 2.0, 1.0)
    assert v_min.inflight(2, 1) == (1.0, 1.0, 1.0, 1.0)


def _grid(name: str, S: int, m: int, slots: int) -> dict[int, str]:
    cells = {d: [IDLE] * slots for d in range(S)}
    for t in run(name, S, m).actions:
        if t.start_s < slots:
            cells[t.rank][int(t.start_s)] = str(t.action)
    return {d: " ".join(row) for d, row in cells.items()}


# S=4, m=8, the first 24 slots ("-" idle), as in the module docstrings.
FIGURES = {
    "v-min": {
        0: "0F0 0F1 -   -   -   -   -   7F0 7B0 7W0 0F2 -   -   7F1 7B1 0B0 7W1 0W0 0F3 7F2 7B2 0B1 7W2 0W1",
        1: "-   1F0 -   -   -   -   6F0 1F1 -   6B0 6W0 -   6F1 1F2 1B0 6B1 6W1 1W0 6F2 1F3 1B1 6B2 6W2 1W1",
        2: "-   -   2F0 -   -   5F0 -   -   2F1 -   5B0 5F1 5W0 2B0 2F2 2W0 5B1 5F2 5W1 2B1 2F3 2W1 5B2 5F3",
        3: "-   -   -   3F0 4F0 -   -   -   -   3F1 4F1 4B0 3B0 4W0 3W0 3F2 4F2 4B1 3B1 4W1 3W1 3F3 4F3 4B2",
    },
    "v-half": {
        0: "0F0 0F1 -   -   -   -   -   7F0 7B0 0F2 7W0 -   7F1 7B1 0F3 7W1 -   7F2 7B2 0F4 0B0 7W2 0W0 7F3",
        1: "-   1F0 1F1 -   -   -   6F0 -   -   6B0 1F2 6F1 6W0 -   6B1 1F3 6F2 6W1 1B0 1W0 6B2 1F4 6F3 6W2",
        2: "-   -   2F0 -   -   5F0 2F1 -   -   5F1 5B0 2F2 5W0 -   5F2 5B1 2F3 2B0 5W1 2W0 5F3 5B2 2F4 2B1",
        3: "-   -   -   3F0 4F0 -   -   3F1 4F1 -   -   4B0 3F2 4F2 3B0 4W0 3W0 4B1 3F3 4F3 3B1 4W1 3W1 4B2",
    },
}


@pytest.mark.parametrize("name", NAMES)
def test_s4_grid_is_the_repeated_block(name: str) -> None:
    grid = _grid(name, 4, 8, 24)
    print(f"\n{name}, S=4, m=8:\n" + "\n".join(f"device {d} | {row}" for d, row in grid.items()))
    assert grid == {d: " ".join(row.split()) for d, row in FIGURES[name].items()}
    # In steady state (blocks 3..6 of 8) every device is busy and repeats its 6 actions.
    timings = run(name, 4, 8).actions
    for d in range(4):
        mine = sorted((t.start_s, t.action) for t in timings if t.rank == d)
        steady = [(s, a) for s, a in mine if 18 <= s < 42]
        assert [s for s, _ in steady] == [float(s) for s in range(18, 42)]
        for (s, a), (s6, a6) in zip(steady, steady[6:], strict=False):
            assert (s6 - s, a6.stage, a6.kind, a6.microbatch) == (6.0, a.stage, a.kind, a.microbatch + 1)


@pytest.mark.parametrize("name", NAMES)
def test_rejects_other_virtual(name: str) -> None:
    with pytest.raises(ScheduleError) as info:
        MODULES[name].create_schedule(4, 8, 3)
    assert str(info.value) == f"{name} runs two chunks per device in a V (got virtual: 3); use virtual=2"
    with pytest.raises(ScheduleError, match=r"^micro_batches must be a positive integer \(got 0\)$"):
        MODULES[name].create_schedule(4, 0)


@pytest.mark.parametrize("name", NAMES)
def test_registered_searched_no_torch_class(name: str) -> None:
    spec = schedule_spec(name)
    assert name in schedule_names() and spec is MODULES[name].SPEC
    assert spec.searched and name in SEARCH_SCHEDULES
    assert spec.torch_class == "" and spec.splits_backward and spec.virtual_choices == (2,)
