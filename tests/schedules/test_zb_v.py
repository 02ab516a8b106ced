"""ZB-V (autopipe/schedules/zb_v.py): V placement, validator-clean grids, the simulated bubble
against the ramp bound, in-flight memory against the simulator and 1F1B, the S=4 picture."""

from __future__ import annotations

from functools import cache

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import (
    format_schedule,
    one_f_one_b,
    schedule_names,
    schedule_spec,
    validate,
    zb_v,
)
from autopipe.schedules.action import IDLE, Kind, v_shape
from autopipe.schedules.simulate import StageCost, Timeline, simulate
from autopipe.solve.request import SEARCH_SCHEDULES

UNIT = StageCost(forward_s=1.0, backward_s=2.0, backward_input_s=1.0, backward_weight_s=1.0,
                 activation_bytes=1.0, weight_grad_bytes=0.5)  # one chunk: F = B = W


@cache  # the tests below read the same 256 timelines; simulate() validates each
def run(devices: int, micro_batches: int) -> Timeline:
    schedule = zb_v.create_schedule(devices, micro_batches)
    return simulate(schedule, [UNIT] * (2 * devices), devices=devices, placement=v_shape)


def test_v_placement() -> None:
    assert [v_shape(j, 4) for j in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert zb_v.SPEC.devices_of(4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert [v_shape(j, 2, 3) for j in range(6)] == [0, 1, 1, 0, 0, 1]  # a zigzag beyond 2


@pytest.mark.parametrize("devices", range(1, 9))
def test_validator_clean(devices: int) -> None:
    # every m <= 32, m < S included: the schedule handles it (padding micro-batches dropped)
    for m in range(1, 33):
        schedule = zb_v.create_schedule(devices, m)
        validate(schedule, devices, m, 2, v_shape)
        for d, actions in schedule.items():
            assert {a.stage for a in actions if a is not None} == {d, 2 * devices - 1 - d}
        assert sum(len(actions) for actions in schedule.values()) == 3 * 2 * devices * m


@pytest.mark.parametrize("devices", range(1, 9))
def test_makespan_is_the_ramp_bound(devices: int) -> None:
    S = devices
    for m in range(1, 33):
        timeline = run(S, m)
        # No schedule beats a device's 6m units of work plus the S-1 forwards before the
        # last device can start; ZB-V reaches that bound once m >= (3S-1)/2.
        bound = 6 * m + S - 1
        assert timeline.iteration_s >= bound
        if 2 * m >= 3 * S - 1:
            assert timeline.iteration_s == bound
        assert timeline.iteration_s == zb_v.makespan_units(S, m)
        assert abs(timeline.bubble_fraction - zb_v.bubble(S, m)) < 1e-9
        if m >= 2 * S:  # the papers' "near zero": a ramp of S-1 units, half of ZB-H1's
            assert zb_v.bubble(S, m) == pytest.approx((S - 1) / (6 * m + S - 1))


@pytest.mark.parametrize("devices", range(1, 9))
def test_inflight_is_what_the_simulator_counts(devices: int) -> None:
    for m in range(1, 33):
        counted = run(devices, m).peak_inflight
        assert tuple(float(c) for c in counted) == zb_v.inflight(devices, m, 2)


@pytest.mark.parametrize("devices", range(1, 9))
def test_peak_memory_is_1f1bs(devices: int) -> None:
    # A stage of 1F1B is two ZB-V chunks: twice the time and twice the activations.
    stage = StageCost(2.0, 4.0, 2.0, 2.0, activation_bytes=2.0)
    for m in range(1, 33):
        zbv = run(devices, m).peak_memory_bytes
        ofob = simulate(one_f_one_b.create_schedule(devices, m), [stage] * devices).peak_memory_bytes
        assert max(zbv) == max(ofob) == 2.0 * min(m, devices)
        if m >= 2 * devices:  # every device at 1F1B's device-0 peak, never above
            assert zbv == (2.0 * devices,) * devices


# S=4, m=8, every action one unit: what each device runs in time slots 0..15 ("-" idle),
# from the construction in zb_v's docstring; it draws the picture of ZB-V in Qi et al.
# (ICLR 2024, ZB-V figure): device 0 runs the 2S-1 = 7 down forwards, then the last
# chunk's F B W; device 3 alternates the two chunks of the turn (3, 4), which need no hop.
FIGURE_S4 = {
    0: "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7B0 7W0 7F1 7B1 7W1 7F2 7B2 7W2",
    1: "-   1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6B0 6W0 6F2 6B1 6W1 6F3 6B2",
    2: "-   -   2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5B0 5W0 5F3 5B1 5W1 2F5",
    3: "-   -   -   3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 4B0 4W0 3F4 3B0 3W0",
}


def test_s4_grid_matches_the_papers_figure() -> None:
    timeline = run(4, 8)
    slots = {d: [IDLE] * 16 for d in range(4)}
    for t in timeline.actions:
        if t.start_s < 16:
            slots[t.rank][int(t.start_s)] = str(t.action)
    grid = {d: " ".join(cells) for d, cells in slots.items()}
    print("\n".join(f"device {d} | {row}" for d, row in grid.items()))
    print(format_schedule(zb_v.create_schedule(4, 8)))
    assert grid == {d: " ".join(row.split()) for d, row in FIGURE_S4.items()}


def test_splits_every_backward() -> None:
    schedule = zb_v.create_schedule(3, 6)
    kinds = [a.kind for actions in schedule.values() for a in actions if a is not None]
    assert kinds.count(Kind.WEIGHT) == kinds.count(Kind.BACKWARD) == 2 * 3 * 6
    assert zb_v.SPEC.splits_backward


def test_rejects_other_virtual() -> None:
    with pytest.raises(ScheduleError) as info:
        zb_v.create_schedule(4, 8, 3)
    assert str(info.value) == (
        "zb-v runs two chunks per device in a V (got virtual: 3); use virtual=2"
    )


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ScheduleError, match=r"^micro_batches must be a positive integer \(got 0\)$"):
        zb_v.create_schedule(4, 0)


def test_registered_and_searched() -> None:
    # --schedule zb-v and plan files naming it work, and the automatic search tries it.
    assert "zb-v" in schedule_names()
    assert schedule_spec("zb-v") is zb_v.SPEC and zb_v.SPEC.searched
    assert "zb-v" in SEARCH_SCHEDULES
