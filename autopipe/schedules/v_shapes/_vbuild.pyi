# Types of the C extension built from _vbuild.c (see v_block.py, its Python twin).
from typing import Any

def build(pattern: Any, devices: int, micro_batches: int, out: Any, /) -> None: ...
