"""Reading emitted stages back: the manifest, and the original model's ``state_dict``.

``autopipe merge stages/ -o model.pt``: :func:`merge_state_dict` gathers every stage's
weights under the model's own names, in its order, tied weights under each of their names,
bit for bit what the model held when :mod:`autopipe.stages.emit` wrote them.

A stage folder is data, read as data: the manifest is checked key by key before anything is
used; a weights file it names must lie inside the folder (no absolute path, no ``..``, no
symlink out); weights are read with ``torch.load(weights_only=True)`` (no pickled code runs)
and every tensor must have the shape and dtype the manifest records. Anything else is one
:class:`~autopipe.errors.EmitError` line naming the file.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

import torch

from autopipe._io import read_json, refused_pickle
from autopipe.errors import EmitError
from autopipe.model.usercode import first_line
from autopipe.stages.emit import FORMAT, FORMAT_VERSION, MANIFEST

__all__ = ["merge_state_dict", "read_manifest"]

_READS = (1, FORMAT_VERSION)  # version 1: unused state without shapes
Where = tuple[str, str, list[int] | None, str | None]  # weights file, name in it, shape, dtype


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest of an emitted folder (EmitError if it is missing, of another format, or
    lacks what merging needs)."""
    root = Path(folder)
    path = root / MANIFEST
    if path.is_symlink() and not _resolves_inside(root, path):  # as the weights are, the manifest is read inside
        raise EmitError(
            f"{path} is a symbolic link out of the folder; merge reads only files inside {root}, "
            "so copy the manifest into it (or give the folder autopipe emit wrote)"
        )
    manifest: Any = read_json(
        path,
        "a stage manifest",
        EmitError,
        "emit the stages again",
        missing=f"{folder} has no {MANIFEST}; give a folder written by 'autopipe emit'",
    )
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise EmitError(f"{path} is not an autopipe stage manifest; give a folder written by 'autopipe emit'")
    version = manifest.get("version")
    if isinstance(version, bool) or version not in _READS:
        reads = " and ".join(map(str, _READS))
        raise EmitError(f"{path} has format version {version!r}, this autopipe reads versions {reads}; emit again")
    _check_manifest(manifest, path)
    return manifest


def merge_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """The original model's ``state_dict`` from emitted stage folders: its names, its order, its
    buffers, each tied weight under every name the model's state_dict has for it.

    A tensor several stages hold (a tied weight) is taken from the first of them; keep the
    copies in step while training (sum their gradients) and they are identical.
    """
    root = Path(folder)
    manifest = read_manifest(root)
    if manifest["weights"] is None:
        raise EmitError(f"{root} was emitted with --no-weights, so it holds no weights to merge; emit again without it")
    where: dict[str, Where] = {}  # original name -> (weights file, name in it, shape, dtype)
    for st in manifest["stages"]:
        for t in st["tensors"]:
            if not t["persistent"]:
                continue
            for o in t["original"]:
                where.setdefault(o, (st["weights"], t["tied_to"] or t["name"], t["shape"], t["dtype"]))
    unused = manifest.get("unused") or {"file": None, "names": []}
    shapes = {t["name"]: t for t in unused.get("tensors", ())}  # version 1: none recorded
    for name in unused["names"]:
        known = shapes.get(name)
        where[name] = (unused["file"], name, known["shape"] if known else None, known["dtype"] if known else None)
    files: dict[str, dict[str, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for key in manifest["state_dict"]:
        if key not in where:
            raise EmitError(f"no stage in {root} holds {key}; the folder is incomplete, emit it again")
        file, name, shape, dtype = where[key]
        if not isinstance(file, str):
            raise EmitError(f"{root / MANIFEST} names no weights file for {key}; emit the stages again")
        if file not in files:
            files[file] = _load(_inside(root, file))
        path = root / file
        if name not in files[file]:
            raise EmitError(f"{path} lacks {name}; the folder is incomplete, emit it again")
        t = files[file][name]
        have = str(t.dtype).removeprefix("torch.")
        if shape is not None and (list(t.shape), have) != (shape, dtype):
            raise EmitError(
                f"{path}: {name} is {tuple(t.shape)} {have}, "
                f"the manifest says {tuple(shape)} {dtype}; emit the stages again"
            )
        out[key] = t
    return out


def _inside(root: Path, name: str) -> Path:
    """``root / name``, refused unless it is a relative path that stays inside ``root``, after
    following symlinks."""
    if "\x00" in name or PurePath(name).is_absolute():
        raise EmitError(
            f"{root / MANIFEST} names weights file {name!r} outside the folder; merge reads only files inside {root}"
        )
    path = root / name
    if not _resolves_inside(root, path):
        raise EmitError(
            f"{root / MANIFEST} names weights file {name!r} outside the folder; merge reads only files inside {root}"
        )
    return path


def _load(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise EmitError(f"weights file {path} is missing; the folder is incomplete, emit it again")
    try:
        if path.suffix == ".safetensors":
            load_file = _safetensors_loader()
            state: Any = load_file(str(path))
        else:
            with warnings.catch_warnings():  # torch warns about odd pickles before refusing them
                warnings.simplefilter("ignore")
                state = torch.load(path, map_location="cpu", weights_only=True)
    except EmitError:
        raise
    except pickle.UnpicklingError as e:
        if refused_pickle(e) is None:  # garbage, not a refused object
            raise EmitError(
                f"weights file {path} is truncated or not a tensor file (unreadable pickle); emit the stages again"
            ) from None
        raise EmitError(
            f"weights file {path} holds pickled objects other than tensors, "
            "refused (loading them could run code); emit the stages again"
        ) from None
    except Exception as e:  # what torch or safetensors raise on a truncated or garbage file
        raise EmitError(
            f"weights file {path} is truncated or not a tensor file "
            f"({first_line(e).split('. ')[0]}); emit the stages again"
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise EmitError(f"weights file {path} does not hold a dict of named tensors; emit the stages again")
    return state


def _safetensors_loader() -> Callable[[str], dict[str, torch.Tensor]]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise EmitError("these weights are .safetensors files; pip install safetensors to read them") from None
    return load_file


# --------------------------------------------------------------------------- manifest checks


def _check_manifest(m: dict[str, Any], path: Path) -> None:
    """Every key merging reads, with its type: one line naming the first that is wrong."""
    where = str(path)

    def need(obj: Any, key: str, ok: Callable[[Any], bool], what: str, at: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise EmitError(f"{where}: {at}{key} is missing; emit the stages again")
        if not ok(obj[key]):
            raise EmitError(f"{where}: {at}{key} must be {what} (got {_short(obj[key])}); emit the stages again")
        return obj[key]

    need(m, "weights", lambda v: v is None or isinstance(v, str), "a format name or null", "")
    need(m, "state_dict", _names, "a list of names", "")
    for i, st in enumerate(need(m, "stages", _dicts, "a list of stage objects", "")):
        at = f"stages[{i}]."
        need(st, "weights", lambda v: v is None or _name(v), "a file name or null", at)
        for j, t in enumerate(need(st, "tensors", _dicts, "a list of tensor objects", at)):
            _check_tensor(t, f"{at}tensors[{j}].", need)
            need(t, "persistent", lambda v: isinstance(v, bool), "true or false", f"{at}tensors[{j}].")
            need(t, "original", _names, "a list of names", f"{at}tensors[{j}].")
            need(t, "tied_to", lambda v: v is None or _name(v), "a name or null", f"{at}tensors[{j}].")
    unused = m.get("unused")
    if unused is not None:
        need(m, "unused", lambda v: isinstance(v, dict), "an object or null", "")
        need(unused, "file", lambda v: v is None or _name(v), "a file name or null", "unused.")
        need(unused, "names", _names, "a list of names", "unused.")
        if m["version"] >= 2:
            for j, t in enumerate(need(unused, "tensors", _dicts, "a list of tensor objects", "unused.")):
                _check_tensor(t, f"unused.tensors[{j}].", need)


def _check_tensor(t: Any, at: str, need: Callable[[Any, str, Callable[[Any], bool], str, str], Any]) -> None:
    need(t, "name", _name, "a name", at)
    need(t, "shape", lambda v: isinstance(v, list) and all(type(d) is int and d >= 0 for d in v), "a list of sizes", at)
    need(
        t,
        "dtype",
        lambda v: isinstance(v, str) and re.fullmatch(r"[a-z][a-z0-9_]*", v) is not None,
        "a dtype name like float32",
        at,
    )


def _name(v: Any) -> bool:
    """A name fit for a one-line message: a string with no newline or other control character."""
    return isinstance(v, str) and v.isprintable()


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(_name(x) for x in v)


def _dicts(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, dict) for x in v)


def _short(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:39] + "…"


def _resolves_inside(root: Path, path: Path) -> bool:
    """Whether ``path``, its symbolic links followed, lies inside ``root`` (False for a link loop)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False
