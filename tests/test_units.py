"""Sizes, rates and durations as people write them."""

from __future__ import annotations

import pytest

from autopipe.errors import PlanError
from autopipe.units import format_count, parse_bytes, parse_duration, parse_rate


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16GiB", 16 * 2**30),
        ("80GB", 80e9),
        ("512 MiB", 512 * 2**20),
        ("1.5G", 1.5 * 2**30),
        ("4096", 4096.0),
        (1e9, 1e9),
    ],
)
def test_parse_bytes(text: str | float, value: float) -> None:
    assert parse_bytes(text) == value


def test_parse_rate_and_duration() -> None:
    assert parse_rate("25GB/s") == 25e9
    assert parse_rate("100MiB/s") == 100 * 2**20
    assert parse_duration("20us") == pytest.approx(2e-5)
    assert parse_duration("1.5ms") == pytest.approx(1.5e-3)
    assert parse_duration("0") == 0.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: parse_bytes("lots", "--memory"),
            "--memory must be a number with a unit, like 16GiB or 80GB (got 'lots')",
        ),
        (lambda: parse_bytes("16 parsecs", "--memory"), "--memory: unknown unit 'parsecs'"),
        (lambda: parse_bytes("-4GB", "--memory"), "--memory must be positive (got '-4GB')"),
        (lambda: parse_bytes(0, "memory"), "memory must be positive (got 0)"),
        (lambda: parse_rate("fast"), "bandwidth must be a number with a unit, like 25GB/s"),
        (lambda: parse_duration("-1ms", "--latency"), "--latency must be zero or more"),
        (
            lambda: parse_bytes("1e400GB", "--memory"),
            "--memory must be a finite number (got '1e400GB'); write it like 16GiB or 80GB",
        ),
        (lambda: parse_bytes("1e308TB", "--memory"), "--memory must be a finite number (got '1e308TB')"),
        (lambda: parse_bytes(float("inf"), "memory"), "memory must be a finite number of bytes (got inf)"),
        (lambda: parse_bytes(float("nan"), "memory"), "memory must be a finite number of bytes (got nan)"),
        (lambda: parse_rate("1e999GB/s", "--bandwidth"), "--bandwidth must be a finite number (got '1e999GB')"),
        (lambda: parse_duration("1e999s", "--latency"), "--latency must be a finite number (got '1e999s')"),
    ],
)
def test_bad_text_is_one_clear_line(call: object, message: str) -> None:
    with pytest.raises(PlanError) as err:
        call()  # type: ignore[operator]
    assert message in str(err.value) and "\n" not in str(err.value)


def test_format_count() -> None:
    assert [format_count(x) for x in (12, 867_072, 1.49e6, 174.6e9)] == ["12", "867.07k", "1.49M", "174.60B"]
