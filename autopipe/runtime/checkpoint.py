"""The model's ``state_dict`` across a pipeline's stages; save and resume a run; reassemble it.

Which stage holds which entry of the model's ``state_dict``: :mod:`autopipe.stages.state`.

``DIR/stage-{j}.pt`` holds virtual stage j's part of that state under the original model's
names (``blocks.3.attn.c_attn.weight``); ``DIR/rank-{r}.pt`` holds rank r's optimizer
state; ``DIR/meta.json`` the plan fingerprint, the number of steps done and of stages.
A tied parameter is saved by every stage that uses it (the copies are equal). The union of the
stage files is exactly the unsplit model's ``state_dict`` (:func:`assemble_state_dict`): its
keys, no others, so ``model.load_state_dict(assemble_state_dict(DIR))`` is strict. Resuming
restores weights, optimizer state and the step counter, so training continues exactly.

Checkpoints are data: every file is loaded with ``torch.load(weights_only=True)`` (tensors,
numbers, strings, lists, tuples and dicts, which is all a model's and torch.optim's state dicts
hold), so a crafted file cannot run code; a truncated, garbage or pickled-object file is a
:class:`~autopipe.errors.RuntimeFailure` naming it.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from autopipe._io import atomic_write_text, read_json, torch_save
from autopipe.errors import RuntimeFailure

__all__ = [
    "Holder",
    "assemble_state_dict",
    "load_file",
    "load_rank",
    "read_meta",
    "save_rank",
    "write_meta",
]


class Holder(Protocol):
    """What saving and resuming need of a rank's pipeline (:class:`~autopipe.runtime.Pipeline`)."""

    def stage_state_dicts(self) -> dict[int, dict[str, torch.Tensor]]: ...

    def load_state_dict(self, state: Mapping[str, torch.Tensor], *, stages: Sequence[int] | None = None) -> None: ...


def save_rank(
    folder: str | Path,
    rank: int,
    states: Mapping[int, Mapping[str, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    step: int,
) -> None:
    """Write each stage's part of the model's state (``states``: stage index -> its
    ``state_dict``, :meth:`Pipeline.stage_state_dicts`) and the optimizer.
    ``step`` goes to ``meta.json`` (:func:`write_meta`), the one place a resume reads it from."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    for index, state in states.items():
        _save({k: v.detach().cpu().clone() for k, v in state.items()}, d / f"stage-{index}.pt")
    _save({"optimizer": optimizer.state_dict()}, d / f"rank-{rank}.pt")


def _save(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary name, then renamed: a file is there whole or not at all."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch_save(obj, tmp)
    os.replace(tmp, path)


def write_meta(folder: str | Path, fingerprint: str, step: int, stages: int) -> None:
    atomic_write_text(
        Path(folder) / "meta.json",
        json.dumps({"fingerprint": fingerprint, "step": step, "stages": stages}, indent=1),
    )


def read_meta(folder: str | Path) -> dict[str, Any]:
    """``meta.json`` of a checkpoint folder: ``fingerprint`` (str), ``step`` and ``stages`` (ints)."""
    path = Path(folder) / "meta.json"
    missing = f"no checkpoint in {folder} (no meta.json); write one with --save-checkpoint {folder}"
    meta = read_json(path, "a valid checkpoint file", RuntimeFailure, _AGAIN, missing=missing)
    kinds = {"fingerprint": str, "step": int, "stages": int}
    if not isinstance(meta, dict) or any(
        type(meta.get(k)) is not t or (t is int and meta[k] < 0) for k, t in kinds.items()
    ):
        raise RuntimeFailure(
            f"{path} is not a valid checkpoint file (it needs fingerprint: a string, step and "
            f"stages: integers >= 0); {_AGAIN}"
        )
    return meta


_AGAIN = "save the checkpoint again with --save-checkpoint"


def load_file(path: Path) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU; a RuntimeFailure naming the file when
    it is not one (truncated, garbage, or holding objects whose unpickling could run code)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickle protocols it reads anyway
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # torch's weights-only unpickler refused it
        found = re.search(r"WeightsUnpickler error:\s*([^\n]*)", str(e))
        detail = found.group(1).strip() if found else ""
        if "global" in detail.lower():  # a class or function: what a crafted file runs
            reason = "it holds Python objects, not only tensors and numbers; not loaded, as that could run code"
        else:
            reason = f"truncated or not written by torch.save: {(detail or 'not a pickle')[:80]}"
    except Exception as e:  # torch raises RuntimeError, KeyError, EOFError... on a damaged file
        reason = f"truncated or not written by torch.save: {_reason(e)}"
    raise RuntimeFailure(f"{path} is not a valid checkpoint file ({reason}); {_AGAIN}")


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (f"{type(e).__name__}: {text[0]}" if text else type(e).__name__)[:160]


def load_rank(
    folder: str | Path,
    rank: int,
    pipe: Holder,
    optimizer: torch.optim.Optimizer,
    fingerprint: str,
) -> int:
    """Restore ``pipe``'s stages and ``optimizer`` from ``folder``; returns the steps already done.
    A stage file's names that are not the stage's (an older checkpoint's extra buffers) are ignored."""
    d = Path(folder)
    meta = read_meta(d)
    if meta.get("fingerprint") != fingerprint:
        raise RuntimeFailure(
            f"checkpoint {folder} is of another model (fingerprint {meta.get('fingerprint')}, plan {fingerprint}); "
            "resume with the plan it was saved with"
        )
    for index, own in pipe.stage_state_dicts().items():
        path = d / f"stage-{index}.pt"
        if not path.is_file():
            raise RuntimeFailure(f"checkpoint {folder} has no {path.name}; it was saved with another plan")
        state = load_file(path)
        try:
            pipe.load_state_dict({k: state[k] for k in own}, stages=[index])
        except (AttributeError, TypeError, KeyError, RuntimeError) as e:
            raise RuntimeFailure(f"{path} does not hold stage {index} of this plan ({_reason(e)}); {_AGAIN}") from None
    path = d / f"rank-{rank}.pt"
    if not path.is_file():
        raise RuntimeFailure(f"checkpoint {folder} has no {path.name}; it was saved with another plan")
    saved = load_file(path)
    try:
        optimizer.load_state_dict(saved["optimizer"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise RuntimeFailure(
            f"{path} does not hold this rank's optimizer state ({_reason(e)}); resume with the "
            "optimizer it was saved with, or start again"
        ) from None
    return int(meta["step"])


def assemble_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """The unsplit model's ``state_dict`` from a checkpoint folder (original names)."""
    out: dict[str, torch.Tensor] = {}
    files = sorted(
        (p for p in Path(folder).glob("stage-*.pt") if p.stem[6:].isdigit()),
        key=lambda p: int(p.stem[6:]),
    )
    if not files:
        raise RuntimeFailure(f"no stage files in {folder}; write a checkpoint with --save-checkpoint {folder}")
    for path in files:
        state = load_file(path)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise RuntimeFailure(f"{path} is not a valid checkpoint file (not a dict of tensors); {_AGAIN}")
        out.update(state)
    return out
