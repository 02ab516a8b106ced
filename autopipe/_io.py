"""Small file helpers shared by the steps that write files: check where, then write atomically.

Every output path (``plan -o``, ``emit -o``, ``merge -o``, ``--timeline``, ``--trace``,
``profile -o``) goes through :func:`check_output_file` or :func:`check_output_folder` before
any slow work starts: a name with a NUL or bytes that are not UTF-8, a folder that does not
exist or is a file, a folder this process cannot write in (tried, not guessed from the mode
bits: root ignores them, /proc refuses root) each give one :class:`~autopipe.errors.OutputError`
line naming the flag, and so does a name too long for its file system (the temporary name
included), a block device or a socket. The writes themselves go to a temporary file beside the
target and are renamed into place, so a failure never leaves half a file and an old file stays
whole. What is not a regular file is written in place instead: a FIFO, a character device
(``/dev/null``) and the process's own streams (``/dev/stdout``, ``/dev/fd/N``) get the bytes, not a
new file in their stead; a symbolic link is written through, to its target, and stays a link.

Every JSON file autopipe reads (plans, profiles, emit's manifest, a checkpoint's ``meta.json``,
device, cluster and calibration files) goes through :func:`read_json`: only a regular file (a FIFO
would block, a device never end), at most :data:`MAX_JSON_BYTES`, UTF-8, nested at most
:data:`MAX_JSON_DEPTH` deep, no more than :data:`MAX_JSON_DIGITS` digits in a row; anything else is
one line of the reader's own error type naming the file and the problem.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

from autopipe.errors import OutputError

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_DIGITS",
    "VERSION",
    "atomic_write",
    "atomic_write_text",
    "check_output_file",
    "check_output_folder",
    "one_line",
    "output_target",
    "parse_json",
    "printable",
    "read_json",
    "refused_pickle",
    "shown",
    "torch_save",
]

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


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if chr(c) not in "\n\t"}


def printable(text: str) -> str:
    """``text`` with its control characters as ``\\x1b``-style escapes (newlines and tabs kept): a string
    from a plan, a profile or a model (a name, a path) can never move the cursor, retitle or recolour
    the terminal it is printed on."""
    return text.translate(_CONTROL)


def one_line(text: str) -> str:
    """``text`` as one printable line: :func:`printable`, and newlines and tabs as ``\\n``, ``\\t``
    too -- for a string from a plan that goes into a generated file's comment or a line-based format
    (a newline in a model's name must not become a line of Megatron arguments)."""
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


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


_STREAMS = ("/dev/", "/proc/")
"""Paths under these are the system's (devices, a process's own descriptors): written in place, never replaced."""


def _in_place(p: Path) -> bool:
    """Whether ``p`` is written in place: a FIFO, a character device, or a path under /dev or /proc that
    exists (``/dev/stdout`` may lead to a regular file a shell opened; replacing it would lose the bytes)."""
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or (stat.S_ISREG(mode) and str(p).startswith(_STREAMS))


def _temp_name(p: Path) -> Path:
    """The temporary name beside ``p`` that :func:`atomic_write` writes first (the same suffix, so
    writers that go by it pick the same format)."""
    return p.with_name(f".{os.getpid()}-{secrets.token_hex(4)}.tmp{p.suffix}")


def _kind(mode: int) -> str | None:
    """What a special file that cannot be an output is, or None for a regular file, FIFO or character device."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def output_target(path: str | Path) -> Path:
    """Where writing ``path`` puts the bytes: the file a symbolic link leads to (the link stays), else ``path``."""
    p = Path(path)
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def _check_length(p: Path, what: str, shown_as: Path) -> None:
    try:
        limit = os.pathconf(p.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    longest = max(len(os.fsencode(p.name)), len(os.fsencode(_temp_name(p).name)))
    if longest > limit:
        raise OutputError(
            f"{what} {shown(shown_as)}: the name is too long ({longest} bytes with the temporary name; "
            f"this file system takes {limit}); choose a shorter name"
        )


def check_output_file(path: str | Path, what: str, example: str = "out.json") -> Path:
    """``path`` as a Path if a file can be written there (replacing one is fine), else
    OutputError naming ``what`` (the flag); a directory's message suggests ``example`` in it."""
    p = _check_name(path, what)
    _check_parts(p, what, 0)  # the folders above it; its own name, with the temporary one:
    _check_length(p, what, p)
    if p.is_dir():
        raise OutputError(f"{what} {p} is a directory; name a file, e.g. {p / example}")
    if _in_place(p):
        return p
    target = output_target(p)
    try:
        kind = _kind(os.stat(target).st_mode)
    except OSError:
        kind = None  # not there yet (or a dangling link): written new
    if kind is not None:
        raise OutputError(f"{what} {shown(p)} is {kind}, not a file; name a regular file to write")
    _check_writable_folder(target.parent, what, p)
    if target != p:
        _check_length(target, what, p)
    return p


_FOLDER_TEMP_EXTRA = len(".") + len(".12345678.tmp")  # emit builds ``.NAME.XXXXXXXX.tmp`` beside the folder


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:  # a name too long, a loop of links: not a folder to write in
        return False


def _check_parts(p: Path, what: str, last: int) -> Path:
    """Every folder name in ``p`` that does not exist yet, and its last name (``last`` bytes with the
    temporary name), fit the file system: checked before ``exists()``, which raises on such a name.
    Returns the nearest folder above ``p`` that exists."""
    above = p.parent
    while not _exists(above) and above != above.parent:
        above = above.parent
    try:
        limit = os.pathconf(above, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    names = [len(os.fsencode(part)) for part in p.relative_to(above).parts[:-1]]
    longest = max([*names, last])
    if longest > limit:
        raise OutputError(
            f"{what} {shown(p)}: the name is too long ({longest} bytes with the temporary name; "
            f"this file system takes {limit}); choose a shorter name"
        )
    return above


def check_output_folder(path: str | Path, what: str) -> Path:
    """``path`` as a Path if a folder can be made there: it is no file, and the nearest folder
    that exists above it can be written in (the missing ones are made when writing)."""
    p = _check_name(path, what)
    above = _check_parts(p, what, len(os.fsencode(p.name)) + _FOLDER_TEMP_EXTRA)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what} {p} is a file, not a folder; name a new folder")
    _check_writable_folder(above, what, p)
    return p


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temporary name beside ``path`` (same suffix, so writers that go
    by it pick the same format), then rename it to ``path``: a crash or an error never leaves
    half a file, and the old one stays whole. A FIFO, a character device or a stream of this
    process gets the bytes in place (written to a private temporary file first, then copied); a
    symbolic link is written through to its target. An OSError becomes one OutputError line."""
    p = Path(path)
    if _in_place(p):
        _write_in_place(p, write)
        return
    target = output_target(p)
    tmp = _temp_name(target)
    try:
        write(tmp)
        tmp.replace(target)
    except OSError as e:
        raise OutputError(f"cannot write {shown(p)}: {e.strerror or e}") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_in_place(p: Path, write: Callable[[Path], object]) -> None:
    folder = tempfile.mkdtemp(prefix="autopipe-write-")
    try:
        tmp = Path(folder) / f"out{p.suffix}"
        write(tmp)
        with open(tmp, "rb") as src, open(p, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except OSError as e:
        raise OutputError(f"cannot write {shown(p)}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def torch_save(obj: object, path: str | Path) -> None:
    """``torch.save(obj, path)``, a failed write (a full disk, a file size limit) raised as the OSError
    it is: torch reports it as a RuntimeError from its zip writer."""
    import torch

    try:
        torch.save(obj, path)
    except RuntimeError as e:
        if "inline_container" not in str(e) and "write" not in str(e):
            raise
        folder = Path(path).parent
        try:
            full = os.statvfs(folder).f_bavail == 0
        except OSError:
            full = False
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from None
        raise OSError(f"torch.save failed: {str(e).strip().splitlines()[0][:200]}") from None


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` all at once (UTF-8): a crash or an error never leaves half a file."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


# ----------------------------------------------------------------------------- reading JSON

MAX_JSON_BYTES = 128 * 2**20
"""The largest JSON file autopipe reads (a profile of 20,000 blocks is about 30 MB)."""
MAX_JSON_DEPTH = 64
"""The deepest nesting of lists and objects a JSON file may have (autopipe's own files: 5 or so)."""
MAX_JSON_DIGITS = 1000
"""The most digits in a row a JSON file may have (Python refuses to convert an int of over 4300)."""

_DIGITS = bytes(ord("0") if chr(c) in "0123456789" else ord(" ") for c in range(256))
_DROP = bytes(c for c in range(256) if c not in b'[]{}"')  # all but brackets and quotes
# A string, to the end of the text if it is not closed: once it starts it never fails, so no
# input makes the search backtrack (a pattern that can fail at every quote would be quadratic).
_STRING = re.compile(rb'"[^"]*(?:"|\Z)')
_PAIR = re.compile(rb"\[\]|\{\}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


_REFUSED_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+?)(?: was | whose |\.?$)", re.M)
_REFUSED_BUILD = re.compile(r"Can only (?:build|create new object for) .*?but got (\S+)")


def refused_pickle(exc: BaseException) -> str | None:
    """What ``torch.load(weights_only=True)`` refused to unpickle -- ``'posix.system'``, a class or a
    function of the file's own: a file holding pickled Python objects or code, not a damaged one --
    else None. torch words it two ways ("Unsupported global: GLOBAL x" and "Trying to load unsupported
    GLOBAL x whose module m is blocked"); the readers of weights and checkpoints all ask here."""
    text = str(exc)
    found = _REFUSED_GLOBAL.search(text) or _REFUSED_BUILD.search(text)
    return found.group(1).rstrip(".,") if found else None


def _too_deep(data: bytes) -> bool:
    """Whether the lists and objects in ``data`` nest deeper than MAX_JSON_DEPTH. Escaped
    backslashes and quotes go first, then all but brackets and quotes, then the strings: what is
    left is the brackets. Two passes take out the innermost pairs (most of a real file), a running
    sum over the rest (stopping at the first level too deep) does the others. Each step is a pass
    in C over the text, so no input takes long."""
    skeleton = _STRING.sub(b"", data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _DROP))
    removed = 0
    for _ in range(2):
        shorter = _PAIR.sub(b"", skeleton)
        if shorter == skeleton:
            break
        skeleton, removed = shorter, removed + 1
    return any(level > MAX_JSON_DEPTH - removed for level in accumulate(map(_STEP.__getitem__, skeleton)))


def _refused(text: str) -> str | None:
    """Why ``text`` is not parsed at all (nested too deep, a number too long), or None."""
    data = text.encode("utf-8", "surrogatepass")
    if b"0" * (MAX_JSON_DIGITS + 1) in data.translate(_DIGITS):  # a substring search: linear
        return f"more than {MAX_JSON_DIGITS} digits in a row"
    if _too_deep(data):
        return f"nested more than {MAX_JSON_DEPTH} deep"
    return None


def parse_json(text: str | bytes, source: str, what: str, error: type[Exception], again: str) -> Any:
    """The JSON value of ``text`` (from ``source``, a file name or a word), within the limits of
    :func:`read_json`; else ``error``, one line: ``{source} is not {what} (the problem); {again}``."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{source} is not {what} (not UTF-8 text); {again}") from None
    if not isinstance(text, str):
        raise error(f"{source} is not {what} (a {type(text).__name__}, not JSON text); {again}")
    if len(text) > MAX_JSON_BYTES:
        raise error(f"{source} is not {what} (over {MAX_JSON_BYTES // 2**20} MiB); {again}")
    reason = _refused(text)
    if reason is None:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise error(f"{source} is not valid JSON ({e}); {again}") from None
        except RecursionError:  # unbalanced, so the bracket count above let it through
            reason = f"nested more than {MAX_JSON_DEPTH} deep"
        except ValueError as e:  # what the limits above should have caught first
            reason = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
    raise error(f"{source} is not {what} ({reason}); {again}")


def _special(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    return _kind(mode) or "not a regular file"


def read_json(path: str | Path, what: str, error: type[Exception], again: str, *, missing: str | None = None) -> Any:
    """The JSON value in the file at ``path``: ``what`` names the kind of file (``"a plan"``),
    ``error`` is the reader's exception type, ``again`` the advice after every message and
    ``missing`` the whole message for a file that is not there. Only a regular file is opened
    (a FIFO would block, a device never end), of at most MAX_JSON_BYTES, in UTF-8, then
    :func:`parse_json`; every problem is one ``error`` line naming the file."""
    if not isinstance(path, (str, os.PathLike)):
        raise error(f"expected the path of {what} (a str or Path), got {type(path).__name__}")
    p = Path(path)
    name = shown(p)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        mode = os.stat(p).st_mode
        fd = os.open(p, flags) if stat.S_ISREG(mode) else -1  # a FIFO, a device: not even opened
    except (FileNotFoundError, NotADirectoryError):
        raise error(missing or f"{name} does not exist; {again}") from None
    except (OSError, ValueError) as e:  # no permission, a name with NUL, a loop of links
        why = getattr(e, "strerror", None) or e
        raise error(f"cannot read {name} ({why}); check the path and its permissions") from None
    if fd < 0:
        raise error(f"{name} is {_special(mode)}, not {what}; {again}")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # replaced since the stat above
            raise error(f"{name} is {_special(st.st_mode)}, not {what}; {again}")
        if st.st_size > MAX_JSON_BYTES:
            raise error(f"{name} is not {what} ({st.st_size:,} bytes, over {MAX_JSON_BYTES // 2**20} MiB); {again}")
        try:
            data = f.read(MAX_JSON_BYTES + 1)
        except OSError as e:
            raise error(f"cannot read {name} ({e.strerror or e}); check the path and its permissions") from None
    if len(data) > MAX_JSON_BYTES:
        raise error(f"{name} is not {what} (over {MAX_JSON_BYTES // 2**20} MiB); {again}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{name} is not {what} (not UTF-8 text); {again}") from None
    return parse_json(text, name, what, error, again)
