"""Schedules as data: parsing and printing, the generators, and the validator's messages."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import (
    SCHEDULES,
    Action,
    Schedule,
    format_schedule,
    gpipe,
    has_split_backward,
    interleaved,
    make_schedule,
    one_f_one_b,
    parse_schedule,
    round_robin,
    to_table,
    validate,
    zb_h1,
)

# --- Action ------------------------------------------------------------------------------------


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


def test_round_robin() -> None:
    assert [round_robin(j, 4) for j in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


# --- tables, grids ----------------------------------------------------------------------------


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
    schedule = make_schedule(name, 3, 6, 2 if name == "interleaved-1f1b" else 1)
    assert parse_schedule(to_table(schedule)) == schedule


def test_format_schedule_grid() -> None:
    schedule = parse_schedule({0: ["0F0", "0F1", "-", "0B0"], 1: ["", "1F0", "1B0"]})
    assert format_schedule(schedule) == (
        "step    0    1    2    3\nrank 0  0F0  0F1  -    0B0\nrank 1  -    1F0  1B0"
    )
    marked = format_schedule(schedule, mark=(1, 2))
    assert marked.splitlines()[2] == "rank 1  -    1F0 >1B0<"


def test_has_split_backward() -> None:
    assert not has_split_backward(make_schedule("1f1b", 2, 2))
    assert has_split_backward(make_schedule("zb-h1", 2, 2))


# --- generators: exact small cases -------------------------------------------------------------

EXACT: list[tuple[str, int, int, int, dict[int, list[str]]]] = [
    ("gpipe", 2, 2, 1, {0: ["0F0", "0F1", "0B0", "0B1"], 1: ["1F0", "1F1", "1B0", "1B1"]}),
    (
        "gpipe",
        3,
        1,
        1,
        {0: ["0F0", "0B0"], 1: ["1F0", "1B0"], 2: ["2F0", "2B0"]},
    ),
    (
        "1f1b",
        2,
        3,
        1,
        {
            0: ["0F0", "0F1", "0B0", "0F2", "0B1", "0B2"],
            1: ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
        },
    ),
    (
        "1f1b",
        3,
        2,
        1,
        {
            0: ["0F0", "0F1", "0B0", "0B1"],
            1: ["1F0", "1F1", "1B0", "1B1"],
            2: ["2F0", "2B0", "2F1", "2B1"],
        },
    ),
    (
        "1f1b",
        4,
        4,
        1,
        {
            0: ["0F0", "0F1", "0F2", "0F3", "0B0", "0B1", "0B2", "0B3"],
            1: ["1F0", "1F1", "1F2", "1B0", "1F3", "1B1", "1B2", "1B3"],
            2: ["2F0", "2F1", "2B0", "2F2", "2B1", "2F3", "2B2", "2B3"],
            3: ["3F0", "3B0", "3F1", "3B1", "3F2", "3B2", "3F3", "3B3"],
        },
    ),
    (
        "zb-h1",
        2,
        3,
        1,
        {
            0: ["0F0", "0F1", "0B0", "0W0", "0F2", "0B1", "0W1", "0B2", "0W2"],
            1: ["1F0", "1B0", "1F1", "1B1", "1W0", "1F2", "1B2", "1W1", "1W2"],
        },
    ),
    (
        "interleaved-1f1b",
        2,
        2,
        2,
        # m == S: every forward first, backwards through the chunks in reverse
        {
            0: ["0F0", "0F1", "2F0", "2F1", "2B0", "2B1", "0B0", "0B1"],
            1: ["1F0", "1F1", "3F0", "3F1", "3B0", "3B1", "1B0", "1B1"],
        },
    ),
    (
        "interleaved-1f1b",
        2,
        4,
        2,
        # rank 0 warms up with (2-0-1)*2 + (2-1)*2 = 4 forwards, rank 1 with 2
        {
            0: "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3".split(),
            1: "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3".split(),
        },
    ),
]


@pytest.mark.parametrize(("name", "stages", "mbs", "virtual", "table"), EXACT)
def test_exact_schedule(
    name: str, stages: int, mbs: int, virtual: int, table: dict[int, list[str]]
) -> None:
    assert to_table(make_schedule(name, stages, mbs, virtual)) == table


def test_interleaved_virtual_one_is_1f1b() -> None:
    assert interleaved.create_schedule(3, 5, 1) == one_f_one_b.create_schedule(3, 5)


COMBOS = [
    (name, s, m, v)
    for name in sorted(SCHEDULES)
    for s in range(1, 6)
    for m in range(1, 11)
    for v in ((1, 2, 3, 4) if name == "interleaved-1f1b" else (1,))
    if v == 1 or m % s == 0
]


@pytest.mark.parametrize(("name", "stages", "mbs", "virtual"), COMBOS)
def test_generated_schedules_validate(name: str, stages: int, mbs: int, virtual: int) -> None:
    schedule = SCHEDULES[name](stages, mbs, virtual)
    validate(schedule, stages, mbs, virtual)
    assert sorted(schedule) == list(range(stages))
    assert all(a is not None for actions in schedule.values() for a in actions)
    kinds = 3 if name == "zb-h1" else 2
    assert sum(len(actions) for actions in schedule.values()) == kinds * stages * virtual * mbs


# --- generator errors --------------------------------------------------------------------------


def test_unknown_schedule_lists_names() -> None:
    with pytest.raises(ScheduleError) as info:
        make_schedule("pipedream", 2, 2)
    assert str(info.value) == (
        "unknown schedule 'pipedream'; use one of gpipe, 1f1b, interleaved-1f1b, zb-h1"
    )


def test_interleaved_needs_divisible_microbatches() -> None:
    with pytest.raises(ScheduleError) as info:
        make_schedule("interleaved-1f1b", 4, 6, 2)
    assert str(info.value) == (
        "interleaved-1f1b needs micro-batches divisible by devices (micro_batches: 6, devices: 4);"
        " use 4 or 8 micro-batches"
    )


@pytest.mark.parametrize(
    "create", [gpipe.create_schedule, one_f_one_b.create_schedule, zb_h1.create_schedule]
)
def test_single_chunk_schedules_reject_virtual(create: Callable[[int, int, int], Schedule]) -> None:
    with pytest.raises(ScheduleError, match=r"got virtual: 2"):
        create(2, 4, 2)


@pytest.mark.parametrize(
    ("stages", "mbs", "virtual"), [(0, 2, 1), (2, 0, 1), (2, 2, 0), (-1, 2, 1)]
)
def test_sizes_must_be_positive(stages: int, mbs: int, virtual: int) -> None:
    with pytest.raises(ScheduleError, match="must be a positive integer"):
        make_schedule("1f1b", stages, mbs, virtual)


# --- validator messages ------------------------------------------------------------------------

INVALID: list[tuple[str, dict[int, list[str]], int, int, str, tuple[int, int] | None]] = [
    (
        "missing B",
        {0: ["0F0", "0F1", "0B0"], 1: ["1F0", "1B0", "1F1", "1B1"]},
        2,
        2,
        "0B1 is missing: every (stage, micro-batch) needs one F and one B",
        None,
    ),
    (
        "wrong rank",
        {0: ["0F0", "1F0", "0B0"], 1: ["1B0"]},
        2,
        1,
        "rank 0 step 1: 1F0 belongs on rank 1 (the schedule's place for stage 1 on 2 devices)",
        (0, 1),
    ),
    (
        "B before F",
        {0: ["0F0", "0B0"], 1: ["-", "1B0", "1F0"]},
        2,
        1,
        "rank 1 step 1: 1B0 runs before 1F0",
        (1, 1),
    ),
    (
        "W before B",
        {0: ["0F0", "0W0", "0B0"]},
        1,
        1,
        "rank 0 step 1: 0W0 runs before 0B0",
        (0, 1),
    ),
    (
        "deadlock",
        # rank 0 waits for 1B0 before sending 0F1; rank 1 waits for 0F1 before running 1B0
        {0: ["0F0", "0B0", "0F1", "0B1"], 1: ["1F0", "1F1", "1B0", "1B1"]},
        2,
        2,
        "deadlock: no rank can run its next step (rank 0 step 1: 0B0 waits for 1B0; "
        "rank 1 step 1: 1F1 waits for 0F1)",
        (0, 1),
    ),
    (
        "duplicate",
        {0: ["0F0", "0F0", "0B0"]},
        1,
        1,
        "rank 0 step 1: 0F0 appears twice (first at rank 0 step 0)",
        (0, 1),
    ),
    (
        "partial W",
        {0: ["0F0", "0B0", "0W0", "0F1", "0B1"]},
        1,
        2,
        "0W1 is missing: a schedule with W actions needs one W per (stage, micro-batch)",
        None,
    ),
    (
        "stage out of range",
        {0: ["0F0", "2F0", "0B0"], 1: ["1F0", "1B0"]},
        2,
        1,
        "rank 0 step 1: 2F0 names stage 2, but there are 2 virtual stages (devices: 2, virtual: 1)",
        (0, 1),
    ),
    (
        "micro-batch out of range",
        {0: ["0F0", "0F5", "0B0"]},
        1,
        1,
        "rank 0 step 1: 0F5 names micro-batch 5, outside 0..0 (micro_batches: 1)",
        (0, 1),
    ),
    (
        "rank out of range",
        {0: ["0F0", "0B0"], 3: []},
        1,
        1,
        "rank 3 is outside 0..0 (devices: 1)",
        None,
    ),
]


@pytest.mark.parametrize(
    ("table", "stages", "mbs", "summary", "mark"),
    [case[1:] for case in INVALID],
    ids=[case[0] for case in INVALID],
)
def test_invalid_schedule_message(
    table: dict[int, list[str]],
    stages: int,
    mbs: int,
    summary: str,
    mark: tuple[int, int] | None,
) -> None:
    schedule = parse_schedule(table)
    with pytest.raises(ScheduleError) as info:
        validate(schedule, stages, mbs)
    first, _, grid = str(info.value).partition("\n")
    assert first == summary
    assert grid == format_schedule(schedule, mark)
    if mark is not None:
        assert f">{schedule[mark[0]][mark[1]]}" in grid


def test_valid_table_with_idle_slots() -> None:
    schedule: Schedule = parse_schedule(
        {0: ["0F0", "0F1", " ", " ", "0B0", "0B1"], 1: [" ", "1F0", "1F1", "1B0", "1B1"]}
    )
    validate(schedule, 2, 2)
