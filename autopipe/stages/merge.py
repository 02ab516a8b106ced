"""Reading emitted stages back: the manifest, and the original model's ``state_dict``.

``autopipe merge stages/ -o model.pt``: :func:`merge_state_dict` gathers every stage's
weights under the model's own names, in its order, tied weights under each of their names,
bit for bit what the model held when :mod:`autopipe.stages.emit` wrote them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from autopipe.errors import EmitError
from autopipe.stages.emit import FORMAT, FORMAT_VERSION, MANIFEST

__all__ = ["merge_state_dict", "read_manifest"]


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest of an emitted folder (EmitError if it is missing or of another format)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise EmitError(f"{folder} has no {MANIFEST}; give a folder written by 'autopipe emit'")
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise EmitError(f"{path} is not valid JSON ({e}); emit the stages again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise EmitError(f"{path} is not an autopipe stage manifest; give a folder written by 'autopipe emit'")
    if manifest.get("version") != FORMAT_VERSION:
        raise EmitError(f"{path} has format version {manifest.get('version')}, this autopipe reads {FORMAT_VERSION}; emit again")
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
    where: dict[str, tuple[str, str]] = {}  # original name -> (weights file, name in it)
    for st in manifest["stages"]:
        for t in st["tensors"]:
            if not t["persistent"]:
                continue
            for o in t["original"]:
                where.setdefault(o, (st["weights"], t["tied_to"] or t["name"]))
    unused = manifest.get("unused") or {"file": None, "names": []}
    for name in unused["names"]:
        where[name] = (unused["file"], name)
    files: dict[str, dict[str, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for key in manifest["state_dict"]:
        if key not in where:
            raise EmitError(f"no stage in {root} holds {key}; the folder is incomplete, emit it again")
        file, name = where[key]
        if file not in files:
            files[file] = _load(root / file)
        if name not in files[file]:
            raise EmitError(f"{root / file} lacks {name}; the folder is incomplete, emit it again")
        out[key] = files[file][name]
    return out


def _load(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise EmitError(f"weights file {path} is missing; the folder is incomplete, emit it again")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=True)
    return state
