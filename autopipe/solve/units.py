"""Human-readable byte counts (binary units) for one-line messages."""

from __future__ import annotations

import math

__all__ = ["format_bytes"]

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
