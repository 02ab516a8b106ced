"""Schedules as integer arrays: exact both ways, for every schedule, and through the spec."""

from __future__ import annotations

import numpy as np
import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import SPECS, make_schedule
from autopipe.schedules.action import Action, Kind
from autopipe.schedules.lists import from_schedule, placed, rank_array, tiled, to_schedule

FAST = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipe-v")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_lists_round_trip_and_match_the_action_lists(spec) -> None:
    devices, m = 4, 8
    v = 2 if spec.takes_virtual else 1
    schedule = make_schedule(spec.name, devices, m, v)
    lists = spec.lists(devices, m, v)
    real = {r: [a for a in acts if a is not None] for r, acts in schedule.items()}
    assert to_schedule(lists) == real
    for r, rows in enumerate(from_schedule(schedule, devices)):
        assert np.array_equal(rows, lists[r])
        assert rows.dtype == np.int64 and rows.shape[1] == 3


def test_idle_slots_drop_and_empty_ranks_keep_their_shape() -> None:
    schedule = {0: [Action(0, Kind.FORWARD, 0), None, Action(0, Kind.WEIGHT, 0)]}
    lists = from_schedule(schedule, 2)
    assert lists[0].tolist() == [[0, 0, 0], [0, 2, 0]]
    assert lists[1].shape == (0, 3)
    assert rank_array([]).shape == (0, 3)


def test_a_rank_outside_the_devices_is_named() -> None:
    with pytest.raises(ScheduleError, match=r"schedule has rank 3, but only ranks 0\.\.1 exist"):
        from_schedule({3: [Action(0, Kind.FORWARD, 0)]}, 2)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_create_lists_is_create_schedule_in_integers(spec) -> None:
    if spec.name in FAST:
        assert spec.create_lists is not None
    if spec.create_lists is None:
        return
    for v in spec.virtual_choices if spec.takes_virtual else (1,):
        for S in (1, 3, 5):
            for m in sorted({S, 2 * S, 2 * S + 1, 3 * S, 17}):
                if m < spec.least_micro_batches(S) or (v > 1 and spec.micro_batches_multiple_of_devices and m % S):
                    continue
                lists = spec.create_lists(S, m, v)
                assert len(lists) == S and all(r.dtype == np.int64 and r.shape[1] == 3 for r in lists)
                expected = from_schedule(spec.create_schedule(S, m, v), S)
                assert all(np.array_equal(a, b) for a, b in zip(lists, expected, strict=True)), (S, m, v)


@pytest.mark.parametrize("name", FAST)
def test_create_lists_refuses_as_create_schedule_does(name) -> None:
    spec = next(s for s in SPECS if s.name == name)
    bad_virtual = 3 if spec.takes_virtual else 2
    if name == "interleaved-1f1b":  # any v; m must be a multiple of S instead
        cases = [(4, 6, 2), (4, 0, 2)]
    else:
        cases = [(4, 8, bad_virtual), (4, 0, 1 if not spec.takes_virtual else 2), (0, 4, 1)]
    if name == "dualpipe-v":
        cases.append((4, 7, 2))
    for S, m, v in cases:
        with pytest.raises(ScheduleError) as made:
            spec.create_schedule(S, m, v)
        with pytest.raises(ScheduleError) as listed:
            spec.lists(S, m, v)
        assert str(listed.value) == str(made.value) and "\n" not in str(made.value)


def test_tiled_numbers_each_stage_and_kind_in_run_order() -> None:
    # codes 3 * stage + kind; short patterns, a long list run once (numbered by masks), none
    long = [3 * 7 + 2, 3 * 1, 3 * 7 + 2] * 7
    rows = tiled(((0,), 2), ((0, 1), 2), ((5,), 0), ((1, 2), 1), ((1,), -3), (long, 1), ((3, 23), 2))
    assert rows[:8].tolist() == [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 0, 3], [0, 1, 1], [0, 1, 2], [0, 2, 0]]
    assert rows[8:11].tolist() == [[7, 2, 0], [1, 0, 0], [7, 2, 1]]
    assert rows[-4:].tolist() == [[1, 0, 7], [7, 2, 14], [1, 0, 8], [7, 2, 15]]
    assert len(rows) == 8 + 21 + 4 and tiled().shape == (0, 3) and tiled(((1,), 0)).shape == (0, 3)


def test_placed_puts_each_rank_s_actions_where_they_run() -> None:
    ranks = np.arange(2)[:, None]
    mb = np.arange(2)[None, :]
    # rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1 (stage = rank)
    lists = placed(2, 4, (0, ranks, np.array([[0, 1], [0, 2]]), mb), (1, ranks, np.array([[2, 3], [1, 3]]), mb))
    assert [rows.tolist() for rows in lists] == [
        [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]],
        [[1, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1]],
    ]
