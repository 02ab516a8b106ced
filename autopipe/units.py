"""Sizes, rates and durations: printed for people, parsed from what people type.

``format_bytes(1.5 * 2**30) == "1.5 GiB"``; ``parse_bytes("16GiB")``, ``parse_bytes("80GB")``
(GB, MB decimal; GiB, MiB and bare G, M binary), ``parse_rate("25GB/s")``,
``parse_duration("20us")``. Bad text raises :class:`~autopipe.errors.PlanError` naming
``what`` (the flag or argument) and an example.

:func:`check_int`, :func:`check_seconds`, :func:`check_path` and :func:`check_kind` are the one
argument checker of the Python API (``autopipe.plan(stages="2")``, ``Plan.load(None)``): one line
naming the keyword, what it must be and what it got, worded as the CLI words its flags
(``stages must be a positive integer (got '2', a str)`` beside ``--stages must be a positive integer``).
"""

from __future__ import annotations

import math
import operator
import os
from pathlib import Path

from autopipe.errors import InputError, PlanError

__all__ = [
    "COUNT_BOUNDS",
    "check_count",
    "check_int",
    "check_kind",
    "check_path",
    "check_seconds",
    "format_bytes",
    "format_count",
    "parse_bytes",
    "parse_duration",
    "parse_rate",
]

COUNT_BOUNDS: dict[str, tuple[int, int]] = {  # counts a user sets (the library's field): smallest, largest
    "threads": (1, 1024),  # torch threads per process: beyond, torch's thread pool fails (a segfault)
    "warmup": (0, 1000),  # untimed runs per measurement
    "repeat": (1, 1000),  # timed runs per measurement
    "steps": (1, 10**7),  # optimizer steps of one run (longer: several runs with checkpoints)
}
"""The one table of these bounds: the CLI's flags (``cli/args.py``), the API's arguments and the run's
options all check them here, so a value that would run for days or crash torch is one line first.
(The plan's own counts -- devices, micro-batches, batch -- are bounded where plans are read: plans.py.)"""


def check_count(value: object, field: str, name: str | None = None, error: type[InputError] = PlanError) -> int:
    """``value`` if it is an integer within :data:`COUNT_BOUNDS` ``[field]``, else ``error`` naming it
    as ``name`` (default: the field, the API's keyword)."""
    low, high = COUNT_BOUNDS[field]
    said = name if name is not None else field
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{said} must be an integer from {low} to {high} (got {value!r})")
    if not low <= value <= high:
        raise error(f"{said} must be from {low} to {high} (got {value})")
    return value


def _a(value: object) -> str:
    """``a str``, ``an int``, ``None``: how a message names what was given."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _got(value: object) -> str:
    """``'2', a str``: the value and its type, for a message (the repr cut short)."""
    try:
        shown = repr(value)
    except Exception:  # a caller's object whose repr fails
        return _a(value)
    shown = shown if len(shown) <= 60 else shown[:59] + "…"
    return shown if value is None else f"{shown}, {_a(value)}"


def _range(low: int, high: int | None) -> str:
    if high is not None:
        return f"an integer from {low} to {high}"
    return "a positive integer" if low == 1 else f"an integer >= {low}"


def check_int(
    value: object,
    name: str,
    *,
    low: int = 1,
    high: int | None = None,
    error: type[InputError] = PlanError,
    ranged: bool = True,
) -> int:
    """``value`` if it is an integer (not a bool; numpy's integers count) in ``[low, high]``, else
    ``error`` naming it as ``name``: ``stages must be a positive integer (got 2.5, a float)``.
    ``ranged=False``: the type only (a caller that words its own range check)."""
    if isinstance(value, bool) or isinstance(value, float) or not hasattr(type(value), "__index__"):
        raise error(f"{name} must be {_range(low, high)} (got {_got(value)})")
    n = operator.index(value)  # type: ignore[arg-type]
    if (ranged and n < low) or (high is not None and n > high):
        raise error(f"{name} must be {_range(low, high)} (got {n})")
    return n


def check_seconds(value: object, name: str, *, error: type[InputError] = PlanError) -> float:
    """``value`` if it is a finite number of seconds, zero or more: ``action_overhead_s must be a number
    of seconds, like 1e-3 for 1 ms (got '1ms', a str)``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{name} must be a number of seconds, like 1e-3 for 1 ms (got {_got(value)})")
    if not (math.isfinite(value) and value >= 0):
        raise error(f"{name} must be zero or more seconds (got {value!r})")
    return float(value)


def check_path(value: object, name: str, what: str, *, error: type[InputError] = InputError) -> Path:
    """``value`` as a Path if it is a str or an ``os.PathLike``: ``path must be the path of a plan JSON
    (a str or a Path), not None``."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise error(f"{name} must be {what} (a str or a Path), not {_a(value)}")


def check_kind(
    value: object, kind: type | tuple[type, ...], name: str, what: str, error: type[InputError] = InputError
) -> None:
    """``error`` unless ``value`` is a ``kind``: ``plan must be a Plan (autopipe.Plan.load(path)), not None``."""
    if not isinstance(value, kind):
        raise error(f"{name} must be {what}, not {_a(value)}")


_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(n: float, *, round_up: bool = False) -> str:
    """``1.4 GiB``, ``512.0 MiB``, ``12 B``; one decimal, binary units.

    ``round_up`` rounds up at the printed precision, for limits a user will type back in
    (the printed "smallest limit that fits" must fit).
    """
    if math.isinf(n):
        return "unlimited"
    for name, size in _UNITS:
        if abs(n) >= size:
            value = n / size
            if round_up:
                value = math.ceil(value * 10 - 1e-9) / 10
            return f"{value:.1f} {name}"
    return f"{math.ceil(n) if round_up else round(n)} B"


def format_count(n: float) -> str:
    """``867.07k``, ``1.49M``, ``175.00B``: parameter counts and the like."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{suffix}"
    return f"{n:.0f}"


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _number_with_unit(text: str, units: dict[str, float], what: str, example: str, zero_ok: bool = False) -> float:
    t = str(text).strip().lower().replace(" ", "")
    i = len(t)
    while i > 0 and not (t[i - 1].isdigit() or t[i - 1] == "."):
        i -= 1
    try:
        value, unit = float(t[:i]), t[i:]
    except ValueError:
        raise PlanError(f"{what} must be a number with a unit, like {example} (got {text!r})") from None
    if unit not in units:
        raise PlanError(f"{what}: unknown unit {unit!r} in {text!r}; write it like {example}")
    if not math.isfinite(value * units[unit]):
        raise PlanError(f"{what} must be a finite number (got {text!r}); write it like {example}")
    if not (value > 0 or (zero_ok and value == 0)):
        raise PlanError(f"{what} must be {'zero or more' if zero_ok else 'positive'} (got {text!r})")
    return value * units[unit]


def parse_bytes(text: str | float, what: str = "memory") -> float:
    """``"16GiB"`` -> 17179869184.0; a number is taken as bytes."""
    if isinstance(text, (int, float)):
        if not math.isfinite(text):
            raise PlanError(f"{what} must be a finite number of bytes (got {text!r})")
        if not text > 0:
            raise PlanError(f"{what} must be positive (got {text!r})")
        return float(text)
    return _number_with_unit(text, _BYTE_UNITS, what, "16GiB or 80GB")


def parse_rate(text: str, what: str = "bandwidth") -> float:
    """``"25GB/s"`` -> 25e9 bytes per second."""
    t = text.strip()
    if t.lower().endswith("/s"):
        t = t[:-2]
    return _number_with_unit(t, _BYTE_UNITS, what, "25GB/s")


def parse_duration(text: str, what: str = "latency") -> float:
    """``"20us"`` -> 2e-05 seconds (s, ms, us, ns); zero allowed."""
    return _number_with_unit(text, _TIME_UNITS, what, "20us or 1ms", zero_ok=True)
