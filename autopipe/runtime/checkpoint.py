"""Save and resume a pipeline run; reassemble the full model's ``state_dict``.

``DIR/stage-{j}.pt`` holds virtual stage j's parameters and buffers under their names in the
original model (``blocks.3.attn.c_attn.weight``); ``DIR/rank-{r}.pt`` holds rank r's optimizer
state and step count; ``DIR/meta.json`` the plan fingerprint and the number of steps done.
A tied parameter is saved by every stage that uses it (the copies are equal). The union of the
stage files is the unsplit model's ``state_dict`` (:func:`assemble_state_dict`), and resuming
restores weights, optimizer state and the step counter, so training continues exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from autopipe._io import atomic_write_text
from autopipe.errors import RuntimeFailure
from autopipe.stages.split import StageModule

__all__ = ["aliases", "assemble_state_dict", "load_rank", "read_meta", "save_rank", "write_meta"]


def aliases(model: torch.nn.Module) -> dict[str, tuple[str, ...]]:
    """For every tensor of ``model``'s state reachable by several names: name -> its other names."""
    groups: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), []).append(name)
    return {
        n: tuple(o for o in names if o != n)
        for names in groups.values()
        if len(names) > 1
        for n in names
    }


def save_rank(
    folder: str | Path,
    rank: int,
    stages: list[StageModule],
    optimizer: torch.optim.Optimizer,
    step: int,
    other_names: dict[str, tuple[str, ...]] | None = None,
) -> None:
    """Write the stages' weights (under every name the model gives them) and the optimizer."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    for st in stages:
        state = {
            k: v.detach().cpu().clone() for k, v in st.module.state_dict(keep_vars=True).items()
        }
        for k in list(state):
            for alias in (other_names or {}).get(k, ()):
                state.setdefault(alias, state[k])
        torch.save(state, d / f"stage-{st.index}.pt")
    torch.save({"optimizer": optimizer.state_dict(), "step": step}, d / f"rank-{rank}.pt")


def write_meta(folder: str | Path, fingerprint: str, step: int, stages: int) -> None:
    atomic_write_text(
        Path(folder) / "meta.json",
        json.dumps({"fingerprint": fingerprint, "step": step, "stages": stages}, indent=1),
    )


def read_meta(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "meta.json"
    if not path.is_file():
        raise RuntimeFailure(
            f"no checkpoint in {folder} (no meta.json); write one with --save-checkpoint {folder}"
        )
    meta: dict[str, Any] = json.loads(path.read_text())
    return meta


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
            raise RuntimeFailure(
                f"checkpoint {folder} has no {path.name}; it was saved with another plan"
            )
        own = st.module.state_dict()
        st.module.load_state_dict(
            {k: v for k, v in torch.load(path, weights_only=True).items() if k in own}
        )
    saved = torch.load(d / f"rank-{rank}.pt", weights_only=False)
    optimizer.load_state_dict(saved["optimizer"])
    return int(saved["step"])


def assemble_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """The unsplit model's ``state_dict`` from a checkpoint folder (original names)."""
    out: dict[str, torch.Tensor] = {}
    files = sorted(Path(folder).glob("stage-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    if not files:
        raise RuntimeFailure(
            f"no stage files in {folder}; write a checkpoint with --save-checkpoint {folder}"
        )
    for path in files:
        out.update(torch.load(path, weights_only=True))
    return out
