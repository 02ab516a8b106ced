"""Which actions send to another rank, and their cost per send (simulate/sends.py)."""

from __future__ import annotations

import dataclasses

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import schedule_spec
from autopipe.simulate import StageCost, sends_of, with_send_cost


def home(name: str, devices: int, virtual: int = 1) -> list[int]:
    spec = schedule_spec(name)
    return [spec.placement(j, devices, virtual) for j in range(devices * virtual)]


def test_1f1b_on_two_ranks_sends_in_stage_0s_f_and_stage_1s_b() -> None:
    assert sends_of(home("1f1b", 2)) == ((True, False), (False, True))
    assert sends_of(home("1f1b", 4)) == ((True, True, True, False), (False, True, True, True))


def test_interleaved_sends_in_every_f_but_the_last_and_every_b_but_the_first() -> None:
    assert home("interleaved-1f1b", 2, 2) == [0, 1, 0, 1]
    assert sends_of(home("interleaved-1f1b", 2, 2)) == ((True, True, True, False), (False, True, True, True))


def test_the_turn_of_a_v_stays_on_one_rank() -> None:
    """ZB-V on 2 ranks: chunks 0 1 | 2 3 on ranks 0 1 | 1 0; chunk 1 -> 2 is on rank 1."""
    assert home("zb-v", 2, 2) == [0, 1, 1, 0]
    assert sends_of(home("zb-v", 2, 2)) == ((True, False, True, False), (False, True, False, True))


def test_with_send_cost_adds_to_the_sending_f_and_b_only() -> None:
    c = StageCost(1.0, 2.0, 1.5, 0.5, 10.0)
    s0, s1 = with_send_cost([c, c], [0, 1], 0.25)
    assert (s0.forward_s, s0.backward_s, s0.backward_input_s, s0.backward_weight_s) == (1.25, 2.0, 1.5, 0.5)
    assert (s1.forward_s, s1.backward_s, s1.backward_input_s, s1.backward_weight_s) == (1.0, 2.25, 1.75, 0.5)
    assert s0.activation_bytes == s1.activation_bytes == 10.0
    assert with_send_cost([c, c], [0, 0], 0.25) == [c, c]  # one rank: nothing leaves it
    assert with_send_cost([c, c], [0, 1], 0.0) == [c, c]
    with pytest.raises(ScheduleError, match="one rank per virtual stage"):
        with_send_cost([c, c], [0], 0.25)


def test_with_send_cost_keeps_every_other_field() -> None:
    """with_send_cost builds each cost field by field (not dataclasses.replace): a field StageCost
    gains must come through unchanged, not fall back to its default."""
    names = [f.name for f in dataclasses.fields(StageCost)]
    c = StageCost(*(float(n + 1) for n in range(len(names))))
    s0, s1 = with_send_cost([c, c], [0, 1], 0.25)
    for name in names:
        if name not in ("forward_s", "backward_s", "backward_input_s"):
            assert getattr(s0, name) == getattr(s1, name) == getattr(c, name), name
