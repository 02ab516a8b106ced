"""The model's ``state_dict`` across a pipeline's stages; resume a run; reassemble it.

Which stage holds which entry of the model's ``state_dict``: :mod:`autopipe.stages.state`.
Saving, with its commit point: :mod:`autopipe.runtime.commit`.

``DIR/stage-{j}.pt`` holds virtual stage j's part of that state under the original model's
names (``blocks.3.attn.c_attn.weight``); ``DIR/rank-{r}.pt`` holds rank r's optimizer
state; ``DIR/meta.json`` is the manifest: the plan fingerprint, the number of steps done and of
stages, the optimizer and its flags, and every other file of the folder with its size and
SHA-256. A tied parameter is saved by every stage that uses it (the copies are equal). The union
of the stage files is exactly the unsplit model's ``state_dict`` (:func:`assemble_state_dict`):
its keys, no others, so ``model.load_state_dict(assemble_state_dict(DIR))`` is strict. Resuming
restores weights, optimizer state and the step counter, so training continues exactly; the
run's optimizer flags (``--lr``, ``--optimizer-arg``) replace the saved hyperparameters.

A folder is resumed only as its manifest lists it (:func:`verify_folder`): every listed file
there, a regular file (a symbolic link is never followed), of its size and SHA-256, and nothing
else beside ``meta.json``. A mixed, partial or tampered folder is a
:class:`~autopipe.errors.RuntimeFailure` naming the file.

Checkpoints are data: every file is loaded with ``torch.load(weights_only=True)`` (tensors,
numbers, strings, lists, tuples and dicts, which is all a model's and torch.optim's state dicts
hold), so a crafted file cannot run code; a truncated, garbage or pickled-object file is a
RuntimeFailure naming it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import stat
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import torch

from autopipe._io import read_json, refused_pickle
from autopipe.errors import RuntimeFailure

__all__ = [
    "FILE_NAME",
    "META",
    "Holder",
    "assemble_state_dict",
    "file_entry",
    "load_file",
    "load_rank",
    "ranks_of",
    "read_meta",
    "verify_files",
    "verify_folder",
]

META = "meta.json"
FILE_NAME = re.compile(r"(stage|rank)-(0|[1-9][0-9]{0,8})\.pt")  # the files a manifest may list
FORMAT = 2  # meta.json's "format": 2 has the file list and the optimizer
_CHUNK = 1 << 20
_AGAIN = "save the checkpoint again with --save-checkpoint"


class Holder(Protocol):
    """What saving and resuming need of a rank's pipeline (:class:`~autopipe.runtime.Pipeline`)."""

    def stage_state_dicts(self) -> dict[int, dict[str, torch.Tensor]]: ...

    def load_state_dict(self, state: Mapping[str, torch.Tensor], *, stages: Sequence[int] | None = None) -> None: ...


# ------------------------------------------------------------------------------ the manifest


def read_meta(folder: str | Path) -> dict[str, Any]:
    """``meta.json`` of a checkpoint folder, checked: ``fingerprint`` (str), ``step`` and
    ``stages`` (ints), ``optimizer`` (``{"name", "lr", "args"}``) and ``files`` (name ->
    ``{"bytes", "sha256"}``, exactly ``stage-0.pt`` .. ``stage-{stages-1}.pt`` and
    ``rank-0.pt`` .. ``rank-{R-1}.pt``). Read by the one JSON reader
    (:func:`autopipe._io.read_json`), never through a symbolic link."""
    path = Path(folder) / META
    missing = f"no checkpoint in {folder} (no {META}); write one with --save-checkpoint {folder}"
    try:
        info = os.lstat(path)
    except OSError:
        raise RuntimeFailure(missing) from None
    if stat.S_ISLNK(info.st_mode):
        raise RuntimeFailure(f"{path} is a symbolic link, not a checkpoint file (not followed); {_AGAIN}")
    meta = read_json(path, "a valid checkpoint file", RuntimeFailure, _AGAIN, missing=missing)
    problem = _meta_problem(meta)
    if problem:
        raise RuntimeFailure(f"{path} is not a valid checkpoint file ({problem}); {_AGAIN}")
    return dict(meta)


def _meta_problem(meta: object) -> str:
    """What is wrong with a parsed ``meta.json``; empty when nothing is."""
    kinds = {"fingerprint": str, "step": int, "stages": int}
    if not isinstance(meta, dict) or any(
        type(meta.get(k)) is not t or (t is int and meta[k] < 0) for k, t in kinds.items()
    ):
        return "it needs fingerprint: a string, step and stages: integers >= 0"
    if not re.fullmatch(r"[0-9A-Za-z._-]{1,128}", meta["fingerprint"]):
        return "its fingerprint is not one a plan has (letters, digits, '.', '_', '-')"
    if meta.get("format") != FORMAT or not isinstance(meta.get("files"), dict):
        return f"it lists no files: not written by this autopipe's --save-checkpoint (format {FORMAT})"
    files: dict[str, Any] = meta["files"]
    for name, entry in files.items():
        if not FILE_NAME.fullmatch(name):
            return f"it lists {_shown(name)}, which is no checkpoint file's name"
        if not (
            isinstance(entry, dict)
            and type(entry.get("bytes")) is int
            and entry["bytes"] >= 0
            and isinstance(entry.get("sha256"), str)
            and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
        ):
            return f"its entry of {name} needs bytes: an integer >= 0 and sha256: 64 hex digits"
    stages = {n for n in files if n.startswith("stage-")}
    if stages != {f"stage-{j}.pt" for j in range(meta["stages"])}:
        return f"it lists {len(stages)} stage files for {meta['stages']} stages"
    ranks = {n for n in files if n.startswith("rank-")}
    if not ranks or ranks != {f"rank-{r}.pt" for r in range(len(ranks))}:
        return "its rank files are not rank-0.pt to rank-R.pt"
    opt = meta.get("optimizer")
    if not (
        isinstance(opt, dict)
        and isinstance(opt.get("name"), str)
        and opt["name"].isidentifier()
        and type(opt.get("lr")) in (int, float)
        and isinstance(opt.get("args"), dict)
        and all(isinstance(k, str) and type(v) in (int, float) for k, v in opt["args"].items())
    ):
        return "it needs optimizer: its name (a torch.optim class), lr and args (numbers)"
    return ""


def ranks_of(meta: Mapping[str, Any]) -> int:
    """The number of ranks whose optimizer state the checkpoint holds."""
    return sum(1 for n in meta["files"] if n.startswith("rank-"))


def file_entry(path: str | Path) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex}`` of a file, as a manifest lists it."""
    with _open_regular(Path(path)) as f:
        return _digest(f)


def _digest(f: IO[bytes]) -> dict[str, Any]:
    h, size = hashlib.sha256(), 0
    while chunk := f.read(_CHUNK):
        h.update(chunk)
        size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def verify_folder(folder: str | Path, meta: Mapping[str, Any] | None = None, *, hashes: bool = True) -> dict[str, Any]:
    """RuntimeFailure unless ``folder`` is exactly what its manifest lists: every file there, a
    regular file (not a symbolic link), of its size and (``hashes``) SHA-256; nothing else but
    ``meta.json``. Returns the manifest."""
    d = Path(folder)
    meta = read_meta(d) if meta is None else meta
    files: Mapping[str, Mapping[str, Any]] = meta["files"]
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        raise RuntimeFailure(f"cannot read the checkpoint folder {folder} ({e.strerror})") from None
    for name in names:
        if name != META and name not in files:
            raise RuntimeFailure(
                f"{d / name} is not in the checkpoint's {META} (a file of another save, or added since): "
                f"the folder is not one checkpoint; {_AGAIN}"
            )
    for name, entry in files.items():
        path = d / name
        try:
            info = os.lstat(path)
        except OSError:
            raise RuntimeFailure(
                f"checkpoint {folder} has no {name}, which its {META} lists (a partial save); {_AGAIN}"
            ) from None
        if not stat.S_ISREG(info.st_mode):
            raise RuntimeFailure(f"{path} is {_kind(info.st_mode)}, not a checkpoint file (not followed); {_AGAIN}")
        if info.st_size != entry["bytes"]:
            raise RuntimeFailure(
                f"{path} is {info.st_size} bytes, its {META} says {entry['bytes']} "
                f"(changed since the save, or of another save); {_AGAIN}"
            )
        if hashes:
            with _open_regular(path) as f:
                _check_digest(path, _digest(f), entry)
    return dict(meta)


def verify_files(folder: str | Path, meta: Mapping[str, Any], names: Sequence[str]) -> None:
    """RuntimeFailure unless each of ``names`` (files ``meta`` lists) is, in ``folder``, a
    regular file of its SHA-256: a rank's own files, checked before it joins its peers."""
    for name in names:
        entry = meta["files"].get(name)
        if entry is None:
            raise RuntimeFailure(f"checkpoint {folder} has no {name}; it was saved with another plan")
        path = Path(folder) / name
        with _open_regular(path) as f:
            _check_digest(path, _digest(f), entry)


def _check_digest(path: Path, found: Mapping[str, Any], entry: Mapping[str, Any]) -> None:
    if found["bytes"] != entry["bytes"] or found["sha256"] != entry["sha256"]:
        raise RuntimeFailure(
            f"{path} does not match its SHA-256 in {META} (changed since the save, or of another save); {_AGAIN}"
        )


def _open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading, never through a symbolic link, never blocking on a FIFO;
    RuntimeFailure unless it is a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if os.path.islink(path):
            raise RuntimeFailure(f"{path} is a symbolic link, not a checkpoint file (not followed); {_AGAIN}") from None
        raise RuntimeFailure(f"cannot read {path} ({e.strerror}); {_AGAIN}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise RuntimeFailure(f"{path} is {_kind(mode)}, not a checkpoint file; {_AGAIN}")
    return os.fdopen(fd, "rb")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a special file" if not stat.S_ISREG(mode) else "a file"


# ------------------------------------------------------------------------------ loading


def load_file(path: Path, entry: Mapping[str, Any] | None = None) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, of a regular file (a symbolic link is
    not followed) that matches its manifest ``entry`` when one is given; a RuntimeFailure naming
    the file when it is not one (truncated, garbage, or holding objects whose unpickling could
    run code)."""
    with _open_regular(path) as f:
        if entry is not None:
            _check_digest(path, _digest(f), entry)
            f.seek(0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch warns about pickle protocols it reads anyway
                return torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:  # torch's weights-only unpickler refused it
            found = re.search(r"WeightsUnpickler error:\s*([^\n]*)", str(e))
            detail = found.group(1).strip() if found else ""
            if refused_pickle(e) is not None:  # a class, function or code: what a crafted file runs
                reason = "it holds Python objects, not only tensors and numbers; not loaded, as that could run code"
            else:
                reason = f"truncated or not written by torch.save: {(detail or 'not a pickle')[:80]}"
        except Exception as e:  # torch raises RuntimeError, KeyError, EOFError... on a damaged file
            reason = f"truncated or not written by torch.save: {_reason(e)}"
    raise RuntimeFailure(f"{path} is not a valid checkpoint file ({reason}); {_AGAIN}")


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (f"{type(e).__name__}: {text[0]}" if text else type(e).__name__)[:160]


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def load_rank(
    folder: str | Path,
    rank: int,
    pipe: Holder,
    optimizer: torch.optim.Optimizer,
    fingerprint: str,
) -> int:
    """Restore ``pipe``'s stages and ``optimizer``'s state from ``folder``; returns the steps
    already done. ``optimizer``'s hyperparameters (its param groups' ``lr``, ``momentum``...,
    what it was made with) stay: the saved ones are replaced by them. A stage file's names that
    are not the stage's (an older checkpoint's extra buffers) are ignored."""
    d = Path(folder)
    meta = verify_folder(d, hashes=False)  # each file's SHA-256 is checked as it is read
    if meta["fingerprint"] != fingerprint:
        raise RuntimeFailure(
            f"checkpoint {folder} is of another model (fingerprint {meta['fingerprint']}, plan {fingerprint}); "
            "resume with the plan it was saved with"
        )
    for index, own in pipe.stage_state_dicts().items():
        name = f"stage-{index}.pt"
        if name not in meta["files"]:
            raise RuntimeFailure(f"checkpoint {folder} has no {name}; it was saved with another plan")
        state = load_file(d / name, meta["files"][name])
        try:
            pipe.load_state_dict({k: state[k] for k in own}, stages=[index])
        except (AttributeError, TypeError, KeyError, RuntimeError) as e:
            raise RuntimeFailure(
                f"{d / name} does not hold stage {index} of this plan ({_reason(e)}); {_AGAIN}"
            ) from None
    name = f"rank-{rank}.pt"
    if name not in meta["files"]:
        raise RuntimeFailure(f"checkpoint {folder} has no {name}; it was saved with another plan")
    saved = load_file(d / name, meta["files"][name])
    given = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(saved["optimizer"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise RuntimeFailure(
            f"{d / name} does not hold this rank's optimizer state ({_reason(e)}); resume with the "
            "optimizer it was saved with, or start again"
        ) from None
    for group, hyper in zip(optimizer.param_groups, given, strict=True):
        group.update(hyper)  # the run's flags, not the saved run's
    return int(meta["step"])


def assemble_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """The unsplit model's ``state_dict`` from a checkpoint folder (original names), the folder
    checked against its manifest first (:func:`verify_folder`)."""
    d = Path(folder)
    meta = verify_folder(d, hashes=False)
    out: dict[str, torch.Tensor] = {}
    for j in range(meta["stages"]):
        path = d / f"stage-{j}.pt"
        state = load_file(path, meta["files"][path.name])
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise RuntimeFailure(f"{path} is not a valid checkpoint file (not a dict of tensors); {_AGAIN}")
        out.update(state)
    return out
