"""Turn exceptions raised by the user's model file into one-line messages.

autopipe runs code it did not write (the model file's factory, example inputs, loss, the
model's forward). When that code raises, the user needs three things on one line: which of
their functions failed, their own message, and the line of *their* file where it happened --
not a frame deep inside torch. These helpers find that frame and format the line; every caller
that runs user code goes through them so all such messages read alike.

Tests: tests/model/test_load.py.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from types import TracebackType

__all__ = ["display_path", "exception_summary", "exit_summary", "first_line", "user_location"]

_MAX_MESSAGE = 300  # characters of the user's message kept in a one-line error


def display_path(filename: str | Path, shown_as: Path | None = None) -> str:
    """``filename`` as the user reads it: ``shown_as`` if it names the same file (the path they
    typed), else relative to the working directory when below it, else absolute."""
    p = Path(filename)
    if shown_as is not None and _same_file(p, shown_as):
        return str(shown_as)
    try:
        return os.path.relpath(p.resolve()) if p.resolve().is_relative_to(Path.cwd()) else str(p)
    except (OSError, ValueError):
        return str(p)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def user_location(tb: TracebackType | None, path: Path) -> str | None:
    """``"file:line"`` of the innermost frame of ``tb`` inside the user's file ``path``.

    Falls back to the innermost frame in the same folder (a helper module the model file
    imports), and to ``None`` when the traceback never passes through the user's code.
    """
    frames = traceback.extract_tb(tb)
    target = path.resolve()
    for frame in reversed(frames):
        if frame.lineno is not None and _same_file(Path(frame.filename), target):
            return f"{display_path(frame.filename, path)}:{frame.lineno}"
    folder = target.parent
    for frame in reversed(frames):
        f = Path(frame.filename)
        if frame.lineno is not None and f.is_absolute() and f.resolve().parent == folder:
            return f"{display_path(f)}:{frame.lineno}"
    return None


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message, shortened to stay readable."""
    for line in str(exc).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 1] + "…"
    return ""


def exception_summary(exc: BaseException, path: Path) -> str:
    """``"ValueError: their message (models/x.py:12)"`` -- one line, location when known."""
    message = first_line(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    where = user_location(exc.__traceback__, path)
    return f"{text} ({where})" if where else text


def exit_summary(exc: SystemExit, path: Path) -> str:
    """``"called sys.exit(5) (models/x.py:12)"``: user code that tried to end the process, which
    autopipe refuses (an exit from a model file would end autopipe silently with its code)."""
    where = user_location(exc.__traceback__, path)
    text = f"called sys.exit({exc.code!r})" if exc.code is not None else "called sys.exit()"
    return f"{text} ({where})" if where else text
