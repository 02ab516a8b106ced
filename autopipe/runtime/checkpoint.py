"""Save and resume a pipeline run; reassemble the full model's ``state_dict``.

``DIR/stage-{j}.pt`` holds virtual stage j's parameters and buffers under their names in the
original model (``blocks.3.attn.c_attn.weight``); ``DIR/rank-{r}.pt`` holds rank r's optimizer
state; ``DIR/meta.json`` the plan fingerprint, the number of steps done and of stages.
A tied parameter is saved by every stage that uses it (the copies are equal). The union of the
stage files is the unsplit model's ``state_dict`` (:func:`assemble_state_dict`), and resuming
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
from pathlib import Path
from typing import Any

import torch

from autopipe._io import atomic_write_text
from autopipe.errors import RuntimeFailure
from autopipe.stages.split import StageModule

__all__ = ["aliases", "assemble_state_dict", "load_file", "load_rank", "read_meta", "save_rank", "write_meta"]


def aliases(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """For every tensor of ``model``'s state reachable by several names: name -> its other names."""
    groups: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), []).append(name)
    return {n: tuple(o for o in names if o != n) for names in groups.values() if len(names) > 1 for n in names}


def save_rank(
    folder: str | Path,
    rank: int,
    stages: list[StageModule],
    optimizer: torch.optim.Optimizer,
    step: int,
    other_names: dict[str, tuple[str, ...]] | None = None,
) -> None:
    """Write the stages' weights (under every name the model gives them) and the optimizer.
    ``step`` goes to ``meta.json`` (:func:`write_meta`), the one place a resume reads it from."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    for st in stages:
        state = {k: v.detach().cpu().clone() for k, v in st.module.state_dict(keep_vars=True).items()}
        for k in list(state):
            for alias in (other_names or {}).get(k, ()):
                state.setdefault(alias, state[k])
        _save(state, d / f"stage-{st.index}.pt")
    _save({"optimizer": optimizer.state_dict()}, d / f"rank-{rank}.pt")


def _save(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary name, then renamed: a file is there whole or not at all."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_meta(folder: str | Path, fingerprint: str, step: int, stages: int) -> None:
    atomic_write_text(
        Path(folder) / "meta.json",
        json.dumps({"fingerprint": fingerprint, "step": step, "stages": stages}, indent=1),
    )


def read_meta(folder: str | Path) -> dict[str, Any]:
    """``meta.json`` of a checkpoint folder: ``fingerprint`` (str), ``step`` and ``stages`` (ints)."""
    path = Path(folder) / "meta.json"
    if not path.is_file():
        raise RuntimeFailure(f"no checkpoint in {folder} (no meta.json); write one with --save-checkpoint {folder}")
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise RuntimeFailure(f"{path} is not a valid checkpoint file ({_reason(e)}); {_AGAIN}") from None
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
    stages: list[StageModule],
    optimizer: torch.optim.Optimizer,
    fingerprint: str,
) -> int:
    """Restore ``stages`` and ``optimizer`` from ``folder``; returns the steps already done."""
    d = Path(folder)
    meta = read_meta(d)
    if meta.get("fingerprint") != fingerprint:
        raise RuntimeFailure(
            f"checkpoint {folder} is of another model (fingerprint {meta.get('fingerprint')}, plan {fingerprint}); "
            "resume with the plan it was saved with"
        )
    for st in stages:
        path = d / f"stage-{st.index}.pt"
        if not path.is_file():
            raise RuntimeFailure(f"checkpoint {folder} has no {path.name}; it was saved with another plan")
        own = st.module.state_dict()
        state = load_file(path)
        try:
            st.module.load_state_dict({k: v for k, v in state.items() if k in own})
        except (AttributeError, TypeError, RuntimeError) as e:
            raise RuntimeFailure(
                f"{path} does not hold stage {st.index} of this plan ({_reason(e)}); {_AGAIN}"
            ) from None
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
