"""Small file helpers shared by the steps that write files."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["atomic_write_text"]


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` all at once: a crash or an error never leaves half a file."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(p)
    finally:
        if tmp.exists():
            tmp.unlink()
