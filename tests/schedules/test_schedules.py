"""The schedule generators and their registry: exact small cases, every combination validates,
errors."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import (
    SCHEDULES,
    Schedule,
    gpipe,
    interleaved,
    make_schedule,
    one_f_one_b,
    round_robin,
    schedule_spec,
    to_table,
    validate,
    zb_h1,
)


def test_round_robin() -> None:
    assert [round_robin(j, 4) for j in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


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
def test_exact_schedule(name: str, stages: int, mbs: int, virtual: int, table: dict[int, list[str]]) -> None:
    assert to_table(make_schedule(name, stages, mbs, virtual)) == table


def test_interleaved_virtual_one_is_1f1b() -> None:
    assert interleaved.create_schedule(3, 5, 1) == one_f_one_b.create_schedule(3, 5)


COMBOS = [
    (name, s, m, v)
    for name in sorted(SCHEDULES)
    if schedule_spec(name).placement is round_robin  # zb-v's V: tests/schedules/v_shapes/test_zb_v.py
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
    kinds = 3 if schedule_spec(name).splits_backward else 2
    assert sum(len(actions) for actions in schedule.values()) == kinds * stages * virtual * mbs


def test_unknown_schedule_lists_names() -> None:
    with pytest.raises(ScheduleError) as info:
        make_schedule("pipedream", 2, 2)
    assert str(info.value) == (
        "unknown schedule 'pipedream'; "
        "use one of gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-v, v-half, v-min, dualpipe-v"
    )


def test_interleaved_needs_divisible_microbatches() -> None:
    with pytest.raises(ScheduleError) as info:
        make_schedule("interleaved-1f1b", 4, 6, 2)
    assert str(info.value) == (
        "interleaved-1f1b needs micro-batches divisible by devices (micro_batches: 6, devices: 4);"
        " use 4 or 8 micro-batches"
    )


@pytest.mark.parametrize("create", [gpipe.create_schedule, one_f_one_b.create_schedule, zb_h1.create_schedule])
def test_single_chunk_schedules_reject_virtual(create: Callable[[int, int, int], Schedule]) -> None:
    with pytest.raises(ScheduleError, match=r"got virtual: 2"):
        create(2, 4, 2)


@pytest.mark.parametrize(("stages", "mbs", "virtual"), [(0, 2, 1), (2, 0, 1), (2, 2, 0), (-1, 2, 1)])
def test_sizes_must_be_positive(stages: int, mbs: int, virtual: int) -> None:
    with pytest.raises(ScheduleError, match="must be a positive integer"):
        make_schedule("1f1b", stages, mbs, virtual)
