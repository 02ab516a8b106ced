"""The schedule validator's messages: the whole grid with the bad step marked."""

from __future__ import annotations

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import (
    Schedule,
    format_schedule,
    parse_schedule,
    validate,
)

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
        "deadlock: no rank can run its next step (rank 0 step 1: 0B0 waits for 1B0; rank 1 step 1: 1F1 waits for 0F1)",
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
