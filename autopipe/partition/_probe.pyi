# Types of the C extension built from _probe.c (see greedy.py, its Python twin).
from typing import Any

def solve(
    pt: Any,
    pr: Any,
    comm: Any,
    ps: Any,
    pa: Any,
    psa: Any,
    keys: Any,
    cum: Any,
    row_base: Any,
    k: Any,
    cap: Any,
    plain_ok: bool,
    rc_ok: bool,
    lower: float,
    tolerance: float,
    starts: Any,
    rc: Any,
    /,
) -> float | None: ...
def reach(
    ps: Any,
    pa: Any,
    psa: Any,
    keys: Any,
    cum: Any,
    row_base: Any,
    k: float,
    cap: float,
    rc: bool,
    out: Any,
    /,
) -> None: ...
