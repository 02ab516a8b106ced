"""Where a plan file records its model file, and where a reader finds it.

A plan of a model file names it in ``recipe.model_file``. In memory the path is as given (from
the current directory); in the file it is written **relative to the plan file's folder** when
the model file lies in that folder or below it, so a folder moved or copied whole (plan and
model together) still finds it, and **absolute** otherwise (:func:`recorded`). A reader
(:func:`found`) looks a relative path up in the plan file's folder first and then from the
current directory, where plans written before recorded it.

Tests: tests/graph/test_model_file.py.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["found", "recorded"]

_IN_MEMORY = ("", "<model>")  # as autopipe.stages.check.IN_MEMORY: planned from Python, no file


def recorded(model_file: str, plan_path: str | Path) -> str:
    """``model_file`` (as given, from the current directory) as the plan file at ``plan_path``
    records it: relative to the plan's folder when under it, else absolute; "" stays ""."""
    if model_file in _IN_MEMORY:
        return model_file
    model = Path(os.path.abspath(model_file))
    folder = Path(os.path.abspath(Path(plan_path).parent))
    if model.is_relative_to(folder):
        return model.relative_to(folder).as_posix()
    return str(model)


def found(model_file: str, plan_path: str | Path | None) -> str:
    """The recorded ``model_file`` as a path from the current directory: a relative one that
    exists in the plan file's folder is joined to that folder (as the plan's path was given);
    else it is unchanged (an absolute path; an older plan's path from the current directory; a
    file that is missing)."""
    if model_file in _IN_MEMORY or plan_path is None or Path(model_file).is_absolute():
        return model_file
    beside = os.path.normpath(Path(plan_path).parent / model_file)
    return beside if Path(beside).exists() else model_file
