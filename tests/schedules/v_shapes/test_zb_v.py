"""ZB-V (autopipe/schedules/v_shapes/zb_v.py): V placement, validator-clean grids, the simulated bubble
against the ramp bound, in-flight memory against the simulator and 1F1B, the S=4 picture."""

from __future__ import annotations

from functools import cache

import pytest

from autopipe.errors import ScheduleError
from autopipe.planner.request import SEARCH_SCHEDULES
from autopipe.schedules import format_schedule, one_f_one_b, schedule_names, schedule_spec, validate
from autopipe.schedules.action import IDLE, Kind, v_shape
from autopipe.schedules.v_shapes import zb_v
from autopipe.simulate.events import StageCost, Timeline, simulate

UNIT = StageCost(
    forward_s=1.0,
    backward_s=2.0,
    backward_input_s=1.0,
    backward_weight_s=1.0,
    activation_bytes=1.0,
    weight_grad_bytes=0.5,
)  # one chunk: F = B = W


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


def reference_order(devices: int, micro_batches: int) -> dict[int, list[str | None]]:
    """torch.distributed.pipelining's ZB-V lists (``ScheduleZBVZeroBubble.pipeline_order``, made
    without stages or processes), B for its ``I`` (input-grad): ``rank`` leading ``None`` slots,
    then the list, padding micro-batches left as ``None`` -- slot ``i`` of rank ``d`` is where
    the Zero Bubble authors' own generator (sail-sg/zero-bubble-pipeline-parallelism,
    ``handcrafted_zb_v``, which prints the paper's S=4, m=8 picture) puts the action."""
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    made = object.__new__(ScheduleZBVZeroBubble)  # only the three sizes its list reads
    made.pp_group_size, made.num_stages, made._n_microbatches = devices, 2 * devices, micro_batches
    letter = {"F": "F", "I": "B", "W": "W"}
    return {
        d: [
            None if a is None else f"{a.stage_index}{letter[a.computation_type.value]}{a.microbatch_index}"
            for a in made._calculate_single_rank_operations(d)
        ]
        for d in range(devices)
    }


@pytest.mark.parametrize("devices", range(1, 9))
def test_the_lists_are_torchs_and_the_authors(devices: int) -> None:
    for m in range(1, 33):
        mine = {d: [str(a) for a in acts] for d, acts in zb_v.create_schedule(devices, m).items()}
        assert mine == {d: [a for a in acts if a is not None] for d, acts in reference_order(devices, m).items()}, m


# S=4, m=8, every action one unit: what each device runs in time slots 0..15 ("-" idle).
# Compared with the Zero Bubble paper's ZB-V figure (Qi et al., ICLR 2024; the figure of the
# authors' README, "each device is assigned to exactly 2 chunks ... a V shape") as the authors'
# generator prints it (handcrafted_zb_v, get_zb_v_schedule(4, 8)) and torch builds it: the same
# action in every slot (test below, the whole iteration): device 0 runs the 2S-1 = 7 down
# forwards, then the last chunk's F B W; device 3 alternates the two chunks of the turn (3, 4),
# which need no hop; in steady state every device alternates F B W of its two chunks with no
# idle slot, and the last device finishes at 6m + S - 1 = 51 (the ramp bound). The figure's
# colours (white text for a device's first chunk, black for its second) are the lighter, outlined
# second chunk of `autopipe show --timeline` (tests/show/test_draw.py).
FIGURE_S4 = {
    0: "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7B0 7W0 7F1 7B1 7W1 7F2 7B2 7W2",
    1: "-   1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6B0 6W0 6F2 6B1 6W1 6F3 6B2",
    2: "-   -   2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5B0 5W0 5F3 5B1 5W1 2F5",
    3: "-   -   -   3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 4B0 4W0 3F4 3B0 3W0",
}


def slots(devices: int, micro_batches: int) -> dict[int, list[str]]:
    """The simulated unit-time grid: what each device runs in each time slot (``-`` idle)."""
    timeline = run(devices, micro_batches)
    grid = {d: [IDLE] * int(timeline.iteration_s) for d in range(devices)}
    for t in timeline.actions:
        grid[t.rank][int(t.start_s)] = str(t.action)
    return grid


def test_s4_grid_matches_the_papers_figure() -> None:
    grid = slots(4, 8)
    print("\n".join(f"device {d} | {' '.join(f'{c:3}' for c in row)}" for d, row in grid.items()))
    print(format_schedule(zb_v.create_schedule(4, 8)))  # the lists, untimed
    assert {d: " ".join(row[:16]) for d, row in grid.items()} == {
        d: " ".join(row.split()) for d, row in FIGURE_S4.items()
    }
    reference = {d: [IDLE if a is None else a for a in acts] for d, acts in reference_order(4, 8).items()}
    assert {d: row[: len(reference[d])] for d, row in grid.items()} == reference  # every slot, the whole iteration
    assert all(
        len(reference[d]) == 6 * 8 + d and IDLE not in reference[d][d:] for d in range(4)
    )  # no bubble once started
    assert len(grid[3]) == 6 * 8 + 4 - 1 == zb_v.makespan_units(4, 8)


@pytest.mark.parametrize("devices", range(1, 9))
def test_every_grid_is_the_references_or_ahead_of_it(devices: int) -> None:
    """Slot for slot the reference's grid once m >= 2S-1; with fewer micro-batches the reference
    keeps the padding micro-batches' slots empty, and the simulator runs each action as soon as
    its inputs are there: never later than the reference, the iteration shorter."""
    for m in range(1, 33):
        start = {(d, cell): i for d, row in slots(devices, m).items() for i, cell in enumerate(row) if cell != IDLE}
        reference = {
            (d, a): i for d, acts in reference_order(devices, m).items() for i, a in enumerate(acts) if a is not None
        }
        assert start.keys() == reference.keys()
        if m >= 2 * devices - 1:
            assert start == reference, m
        else:
            assert all(start[k] <= reference[k] for k in start), m


def test_splits_every_backward() -> None:
    schedule = zb_v.create_schedule(3, 6)
    kinds = [a.kind for actions in schedule.values() for a in actions if a is not None]
    assert kinds.count(Kind.WEIGHT) == kinds.count(Kind.BACKWARD) == 2 * 3 * 6
    assert zb_v.SPEC.splits_backward


def test_rejects_other_virtual() -> None:
    with pytest.raises(ScheduleError) as info:
        zb_v.create_schedule(4, 8, 3)
    assert str(info.value) == ("zb-v runs two chunks per device in a V (got virtual: 3); use virtual=2")


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ScheduleError, match=r"^micro_batches must be a positive integer \(got 0\)$"):
        zb_v.create_schedule(4, 0)


def test_registered_and_searched() -> None:
    # --schedule zb-v and plan files naming it work, and the automatic search tries it.
    assert "zb-v" in schedule_names()
    assert schedule_spec("zb-v") is zb_v.SPEC and zb_v.SPEC.searched
    assert "zb-v" in SEARCH_SCHEDULES
