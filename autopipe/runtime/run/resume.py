"""``--resume``'s checks before any rank starts, and what a resumed run keeps of the checkpoint.

The folder against its manifest (:func:`~autopipe.runtime.checkpoint.verify_folder`: every file
listed, of its size and, in the launcher, its SHA-256, nothing else, no symbolic link), then
against the run's flags: the seed range, the same optimizer, no ``amsgrad`` the state lacks.
The optimizer state is the checkpoint's, its hyperparameters the run's flags
(:func:`~autopipe.runtime.checkpoint.load_rank`); :func:`resume_note` names those that changed.

Tests: tests/runtime/test_commit.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from autopipe.errors import RunOptionError

__all__ = ["RunFlags", "check_resume", "optimizer_flags", "resume_note"]


class RunFlags(Protocol):
    """What these checks read of a run's options (:class:`~autopipe.runtime.run.options.RunOptions`)."""

    @property
    def resume(self) -> str | None: ...
    @property
    def seed(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def lr(self) -> float: ...
    @property
    def optimizer_kwargs(self) -> tuple[tuple[str, float], ...]: ...


def _shown(text: str) -> str:
    return repr(text if len(text) <= 200 else text[:197] + "...")


def check_resume(o: RunFlags, max_seed: int, hashes: bool = False) -> dict[str, Any]:
    """RunOptionError unless ``o.resume`` can be resumed with ``o``; returns the manifest. The
    folder is checked against it (the files' SHA-256 too with ``hashes``: the launcher's
    check), and it against the run's flags."""
    from autopipe.errors import RuntimeFailure
    from autopipe.runtime.checkpoint import verify_folder

    assert o.resume is not None
    if not Path(o.resume).is_dir():  # a commit cut short where folders cannot swap: finish it
        from autopipe.runtime.commit import recover, target_of

        recover(target_of(o.resume))
    if not Path(o.resume).is_dir():
        raise RunOptionError(f"--resume {_shown(o.resume)}: no such folder; give a folder written by --save-checkpoint")
    try:
        meta = verify_folder(o.resume, hashes=hashes)
    except RuntimeFailure as e:
        raise RunOptionError(f"--resume: {e}") from None
    if not 0 <= o.seed <= max_seed - o.steps - meta["step"]:
        raise RunOptionError(
            f"--seed {o.seed} with --steps {o.steps} after the checkpoint's {meta['step']} steps "
            f"seeds torch beyond {max_seed}; use a smaller --seed"
        )
    saved = meta["optimizer"]
    if saved["name"] != o.optimizer:
        raise RunOptionError(
            f"--resume {_shown(o.resume)}: the checkpoint holds {_shown(saved['name'])} optimizer state, this run "
            f"makes {o.optimizer}; resume with --optimizer {saved['name']}, or start again without --resume"
        )
    if dict(o.optimizer_kwargs).get("amsgrad") and not saved["args"].get("amsgrad"):
        raise RunOptionError(
            f"--optimizer-arg amsgrad=1 with --resume {_shown(o.resume)}: the checkpoint's {o.optimizer} state "
            "was saved without amsgrad and has no running maxima; resume without amsgrad"
        )
    return meta


def optimizer_flags(o: RunFlags) -> dict[str, Any]:
    """The optimizer of a run as a checkpoint's manifest records it."""
    return {"name": o.optimizer, "lr": o.lr, "args": dict(o.optimizer_kwargs)}


def resume_note(saved: dict[str, Any], o: RunFlags) -> str:
    """One line naming the optimizer flags of this run that differ from the checkpoint's run
    (these apply: the optimizer state is the checkpoint's, its hyperparameters the run's);
    empty when none does."""
    changed = [f"--lr {o.lr:g} (the checkpoint's run: {saved['lr']:g})"] if o.lr != saved["lr"] else []
    given, before = dict(o.optimizer_kwargs), saved["args"]
    for key in sorted(set(given) | set(before)):
        if given.get(key) != before.get(key):
            now = f"{key}={given[key]:g}" if key in given else f"{key} at its default"
            then = f"{before[key]:g}" if key in before else "its default"
            changed.append(f"{now} (the checkpoint's run: {then})")
    if not changed:
        return ""
    return f"resuming with this run's optimizer flags: {', '.join(changed)}"
