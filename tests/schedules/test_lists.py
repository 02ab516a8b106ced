"""Schedules as integer arrays: exact both ways, for every schedule, and through the spec."""

from __future__ import annotations

import numpy as np
import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import SPECS, make_schedule
from autopipe.schedules.action import Action, Kind
from autopipe.schedules.lists import from_schedule, rank_array, to_schedule


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
