"""Actions (``1F0``) and schedule tables: parsing, printing, round trips."""

from __future__ import annotations

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import (
    SCHEDULES,
    Action,
    format_schedule,
    has_split_backward,
    make_schedule,
    parse_schedule,
    schedule_spec,
    to_table,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1F0", Action(1, "F", 0)),
        ("0B3", Action(0, "B", 3)),
        ("12W7", Action(12, "W", 7)),
        (" 2F1 ", Action(2, "F", 1)),
        ("", None),
        ("   ", None),
        ("-", None),
    ],
)
def test_parse_action(text: str, expected: Action | None) -> None:
    assert Action.parse(text) == expected


@pytest.mark.parametrize("action", [Action(1, "F", 0), Action(0, "B", 3), Action(10, "W", 11)])
def test_action_round_trip(action: Action) -> None:
    assert Action.parse(str(action)) == action


def test_str_action() -> None:
    assert str(Action(1, "F", 0)) == "1F0"


@pytest.mark.parametrize("text", ["1X0", "F0", "1F", "abc", "1F0x", "-1F0", "1 F 0"])
def test_parse_garbage(text: str) -> None:
    with pytest.raises(ScheduleError) as info:
        Action.parse(text)
    message = str(info.value)
    assert "\n" not in message
    assert repr(text) in message


def test_bad_kind() -> None:
    with pytest.raises(ScheduleError, match="kind 'X' is unknown"):
        Action(0, "X", 0)


def test_parse_and_to_table() -> None:
    table = {1: ["1F0", "1B0"], 0: ["0F0", " ", "0B0"]}
    schedule = parse_schedule(table)
    assert schedule == {
        0: [Action(0, "F", 0), None, Action(0, "B", 0)],
        1: [Action(1, "F", 0), Action(1, "B", 0)],
    }
    assert list(schedule) == [0, 1]
    assert to_table(schedule) == {0: ["0F0", "-", "0B0"], 1: ["1F0", "1B0"]}
    assert parse_schedule(to_table(schedule)) == schedule


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_generated_round_trip(name: str) -> None:
    schedule = make_schedule(name, 3, 6, 2 if schedule_spec(name).takes_virtual else 1)
    assert parse_schedule(to_table(schedule)) == schedule


def test_format_schedule_grid() -> None:
    schedule = parse_schedule({0: ["0F0", "0F1", "-", "0B0"], 1: ["", "1F0", "1B0"]})
    assert format_schedule(schedule) == ("step    0    1    2    3\nrank 0  0F0  0F1  -    0B0\nrank 1  -    1F0  1B0")
    marked = format_schedule(schedule, mark=(1, 2))
    assert marked.splitlines()[2] == "rank 1  -    1F0 >1B0<"


def test_has_split_backward() -> None:
    assert not has_split_backward(make_schedule("1f1b", 2, 2))
    assert has_split_backward(make_schedule("zb-h1", 2, 2))
