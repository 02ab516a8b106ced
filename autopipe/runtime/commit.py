"""Saving a checkpoint with a commit point: ``DIR`` is replaced whole, or not at all.

Every rank writes its files (``stage-J.pt`` of its stages, ``rank-R.pt`` of its optimizer
state) into a new folder beside ``DIR``, ``.DIR.new-TOKEN`` (rank 0's TOKEN, sent to every rank
through the process group), and sends rank 0 each file's size and SHA-256. Rank 0 then writes
the manifest, ``meta.json`` (:mod:`autopipe.runtime.checkpoint`), into the new folder and puts
it in place of ``DIR`` in one rename: on Linux the two folders swap (``renameat2`` with
``RENAME_EXCHANGE``), elsewhere ``DIR`` is first renamed aside to ``.DIR.old-TOKEN``. That
rename is the commit point: before it ``DIR`` is the previous checkpoint, whole, after it the
new one; rank 0 then removes the previous one. (Where the folders cannot swap, a process killed
between the two renames leaves no ``DIR``: the next save into it, or ``--resume`` of it, finishes
the commit, :func:`recover`.)

Nothing is left behind. Rank 0 removes the new folder when anything fails before the commit (a
write error, a peer lost). The ``autopipe run`` launcher, once it has killed its ranks, removes
the new folders of processes no longer running (:func:`clean_leftovers`); when the launcher is
killed outright, its reaper (:mod:`autopipe.runtime.run.reaper`) removes those of its ranks
(:func:`save_prefix`); and the next save into ``DIR`` removes any of a process gone.

Tests: tests/runtime/test_commit.py.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import socket
import sys
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from autopipe._io import atomic_write_text, torch_save
from autopipe.errors import RuntimeFailure
from autopipe.runtime.checkpoint import FILE_NAME, FORMAT, META, file_entry
from autopipe.runtime.comm import Comm

__all__ = [
    "MAX_NAME_BYTES",
    "clean_leftovers",
    "foreign_entry",
    "leftovers",
    "new_token",
    "publish",
    "recover",
    "save",
    "save_prefix",
    "sibling",
    "target_of",
    "write_meta",
    "write_rank_files",
]

_TOKEN = r"([0-9a-f]{6})-([0-9]{1,10})-[0-9a-f]{6}"
MAX_NAME_BYTES = 255 - len(".") - len(".new-") - 6 - 1 - 10 - 1 - 6  # DIR's name, so that the siblings' fit
_LEGACY_TMP = re.compile(r"\.((stage|rank)-[0-9]+\.pt|meta\.json)\.tmp")  # what earlier versions left


def _host() -> str:
    return f"{zlib.crc32(socket.gethostname().encode()) & 0xFFFFFF:06x}"


def new_token() -> str:
    """``HOST-PID-RANDOM``: this process's, unique to one save."""
    return f"{_host()}-{os.getpid()}-{secrets.token_hex(3)}"


def target_of(folder: str | Path) -> Path:
    """The folder a save replaces: ``folder`` absolute, through symbolic links (a link to a
    checkpoint folder stays a link, to the new one)."""
    return Path(os.path.realpath(folder))


def save_prefix(target: Path, kind: str = "new") -> str:
    """``.NAME.new-HOST-`` beside ``target``: what a save's folder name starts with, on this
    machine, before the pid of the process that saves."""
    return str(target.parent / f".{target.name}.{kind}-{_host()}-")


def sibling(target: Path, token: str, kind: str = "new") -> Path:
    """``.NAME.new-TOKEN`` (or ``.old-``) beside ``target``."""
    return target.parent / f".{target.name}.{kind}-{token}"


def foreign_entry(folder: Path) -> str | None:
    """The first entry of an existing ``folder`` that no checkpoint holds (None if none): a save
    replaces the folder whole, so it refuses one with other files."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return None
    for name in names:
        if not (name == META or FILE_NAME.fullmatch(name) or _LEGACY_TMP.fullmatch(name)):
            return name
    return None


def write_rank_files(
    folder: Path, rank: int, states: Mapping[int, Mapping[str, torch.Tensor]], optimizer: torch.optim.Optimizer
) -> dict[str, dict[str, Any]]:
    """Write each stage's part of the model's state (``states``: stage index -> its
    ``state_dict``, :meth:`Pipeline.stage_state_dicts`) and the optimizer's state into
    ``folder``; returns each file's manifest entry (size and SHA-256)."""
    written: dict[str, dict[str, Any]] = {}
    for index, state in states.items():
        path = folder / f"stage-{index}.pt"
        torch_save({k: v.detach().cpu().clone() for k, v in state.items()}, path)
        written[path.name] = file_entry(path)
    path = folder / f"rank-{rank}.pt"
    torch_save({"optimizer": optimizer.state_dict()}, path)
    written[path.name] = file_entry(path)
    return written


def write_meta(
    folder: str | Path,
    *,
    fingerprint: str,
    step: int,
    stages: int,
    files: Mapping[str, Mapping[str, Any]],
    optimizer: Mapping[str, Any],
) -> None:
    """The manifest: what :func:`autopipe.runtime.checkpoint.read_meta` reads back.
    ``optimizer``: ``{"name": "Adam", "lr": 1e-3, "args": {"weight_decay": 0.1}}``."""
    meta = {
        "format": FORMAT,
        "fingerprint": fingerprint,
        "step": step,
        "stages": stages,
        "optimizer": dict(optimizer),
        "files": {k: dict(files[k]) for k in sorted(files)},
    }
    atomic_write_text(Path(folder) / META, json.dumps(meta, indent=1))


def save(
    folder: str | Path,
    rank: int,
    comm: Comm,
    states: Mapping[int, Mapping[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    meta: Mapping[str, Any],
) -> None:
    """Every rank's part of a checkpoint, committed into ``folder`` by rank 0 (a collective:
    every rank calls it). ``meta``: the manifest's ``fingerprint``, ``step``, ``stages`` and
    ``optimizer`` (:func:`write_meta`)."""
    target = target_of(folder)
    token = comm.all_gather_object(new_token() if rank == 0 else None)[0]
    new = sibling(target, token)
    try:
        if rank == 0:
            recover(target)
            clean_leftovers(target)
        new.mkdir(parents=True, exist_ok=True)
        files = write_rank_files(new, rank, states, optimizer)
        written = comm.all_gather_object(files)  # every rank's files are written
        if rank != 0:
            return
        every = {name: entry for part in written for name, entry in part.items()}
        write_meta(new, files=every, **meta)
        publish(new, target, token)
    except BaseException:
        if rank == 0:  # the one that commits is the one that removes: never a folder being renamed
            shutil.rmtree(new, ignore_errors=True)
        raise


def publish(new: Path, target: Path, token: str) -> None:
    """Put the complete folder ``new`` in place of ``target`` (the commit point), then remove
    the previous checkpoint."""
    if os.path.lexists(target) and not target.is_dir():
        raise RuntimeFailure(f"cannot save the checkpoint: {target} is not a folder any more; give a folder")
    name = foreign_entry(target)
    if name is not None:
        raise RuntimeFailure(
            f"cannot save the checkpoint: {target} now holds {name!r}, which is no checkpoint's; "
            "a save replaces the folder whole, so give a new or empty folder"
        )
    if _exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # the previous checkpoint, now at the new folder's name
        return
    try:
        os.rename(new, target)  # no folder there, or an empty one
        return
    except OSError:
        if not target.is_dir():
            raise
    aside = sibling(target, token, "old")
    os.rename(target, aside)  # the commit point here: recover() finishes it if cut short
    os.rename(new, target)
    shutil.rmtree(aside, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where that cannot
    be done (another system, a file system without it, nothing at ``b``)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it (glibc < 2.28, musl < 1.2.?)
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOENT, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False  # nothing at b; not supported here
    raise OSError(err, os.strerror(err), str(b))


def leftovers(target: Path) -> list[Path]:
    """The new and old folders of saves into ``target`` beside it, of every process."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(new|old)-{_TOKEN}")
    try:
        names = sorted(os.listdir(target.parent))
    except OSError:
        return []
    return [target.parent / n for n in names if pattern.fullmatch(n)]


def _dead(path: Path) -> bool:
    """Whether the save that made ``path`` ran on this machine in a process no longer running."""
    found = re.search(rf"-{_TOKEN}$", path.name)
    if found is None or found.group(1) != _host():
        return False
    pid = int(found.group(2))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    try:  # a zombie, not yet reaped, runs no more
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def recover(target: Path) -> None:
    """Finish a commit cut short between its two renames (systems without an atomic swap):
    ``target`` missing and its ``.old-`` folder there. The new folder goes in place if it is
    complete (its manifest written), else the old one goes back."""
    if os.path.lexists(target):
        return
    for old in (p for p in leftovers(target) if ".old-" in p.name and _dead(p)):
        new = sibling(target, old.name.rsplit(".old-", 1)[1])
        source = new if (new / META).is_file() else old
        try:
            os.rename(source, target)
        except OSError:  # another process recovered it meanwhile
            pass
        return


def clean_leftovers(target: str | Path) -> list[Path]:
    """Remove the new and old folders beside ``target`` left by saves whose process is gone
    (killed, or failed); returns those removed."""
    t = target_of(target)
    removed = []
    for path in leftovers(t):
        if _dead(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
