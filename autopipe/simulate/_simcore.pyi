# Types of the C extension built from _simcore.c (see simcore.py, its Python twin).
from typing import Any

def order(
    rows: Any,
    offsets: Any,
    home: Any,
    ranks: int,
    n: int,
    m: int,
    has_w: bool,
    rank: Any,
    stage: Any,
    kind: Any,
    dep: Any,
    hop: Any,
    pos: Any,
    dur: Any,
    split: Any,
    /,
) -> int: ...
def run(
    rank: Any,
    dur: Any,
    dep: Any,
    hop: Any,
    durations: Any,
    comm: Any,
    ranks: int,
    candidates: int,
    start: Any,
    end: Any,
    busy: Any,
    iteration: Any,
    /,
) -> None: ...
def memory(
    rows: Any,
    offsets: Any,
    home: Any,
    has_w: bool,
    costs: Any,
    ranks: int,
    candidates: int,
    peak: Any,
    /,
) -> None: ...
