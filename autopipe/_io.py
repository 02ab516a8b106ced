"""Small file helpers shared by the steps that write files: check where, then write atomically.

Every output path (``plan -o``, ``emit -o``, ``merge -o``, ``--timeline``, ``--trace``,
``profile -o``) goes through :func:`check_output_file` or :func:`check_output_folder` before
any slow work starts: a name with a NUL or bytes that are not UTF-8, a folder that does not
exist or is a file, a folder this process cannot write in (tried, not guessed from the mode
bits: root ignores them, /proc refuses root) each give one :class:`~autopipe.errors.OutputError`
line naming the flag. The writes themselves go to a temporary file beside the target and are
renamed into place, so a failure never leaves half a file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from autopipe.errors import OutputError

__all__ = ["VERSION", "atomic_write", "atomic_write_text", "check_output_file", "check_output_folder", "shown"]

VERSION = "0.1.0"
"""autopipe's release (``autopipe.__version__``), stamped into the files it writes that say who made
them (emit's manifest and stage sources); here, at the bottom of the flow, so every step can read it."""


def shown(path: str | Path) -> str:
    """``path`` as printable text: bytes that are not UTF-8 as ``\\xff`` escapes."""
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:  # a surrogate that no file name decodes to
        return str(path).encode("utf-8", "backslashreplace").decode("ascii", "replace")
    return raw.decode("utf-8", "backslashreplace")


def _check_name(path: str | Path, what: str) -> Path:
    text = str(path)
    if not text:
        raise OutputError(f"{what} is empty; name a file to write")
    if "\x00" in text:
        raise OutputError(f"{what} {shown(text)!r} contains a NUL byte; choose another name")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise OutputError(f"{what} {shown(text)} has bytes that are not UTF-8; choose a UTF-8 name") from None
    return Path(text)


def _check_writable_folder(folder: Path, what: str, target: Path) -> None:
    """One line unless ``folder`` is an existing directory this process can create files in."""
    if not folder.exists():
        raise OutputError(f"{what} {target}: folder {folder} does not exist; create it or write elsewhere")
    if not folder.is_dir():
        raise OutputError(f"{what} {target}: {folder} is a file, not a folder; write elsewhere")
    try:
        fd, probe = tempfile.mkstemp(prefix=".autopipe-", suffix=".probe", dir=folder)
    except OSError as e:
        raise OutputError(f"{what} {target}: cannot write in {folder} ({e.strerror or e}); write elsewhere") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str | Path, what: str) -> Path:
    """``path`` as a Path if a file can be written there (replacing one is fine), else
    OutputError naming ``what`` (the flag)."""
    p = _check_name(path, what)
    if p.is_dir():
        raise OutputError(f"{what} {p} is a directory; name a file, e.g. {p / 'out.json'}")
    _check_writable_folder(p.parent, what, p)
    return p


def check_output_folder(path: str | Path, what: str) -> Path:
    """``path`` as a Path if a folder can be made there: it is no file, and the nearest folder
    that exists above it can be written in (the missing ones are made when writing)."""
    p = _check_name(path, what)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what} {p} is a file, not a folder; name a new folder")
    above = p.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    _check_writable_folder(above, what, p)
    return p


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temporary name beside ``path`` (same suffix, so writers that go
    by it pick the same format), then rename it to ``path``: a crash or an error never leaves
    half a file. An OSError becomes one OutputError line."""
    p = Path(path)
    tmp = p.with_name(f".{p.stem}.{os.getpid()}.tmp{p.suffix}")
    try:
        write(tmp)
        tmp.replace(p)
    except OSError as e:
        raise OutputError(f"cannot write {p}: {e.strerror or e}") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` all at once (UTF-8): a crash or an error never leaves half a file."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
