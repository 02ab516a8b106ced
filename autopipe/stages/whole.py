"""Modules an emitted stage keeps whole, and the model file it builds them from.

A stage's source (:mod:`autopipe.stages.source`) writes each torch leaf module as its
constructor; a module it cannot write so (a ``--leaf`` class of the model's own code, a torch
module with submodules such as ``nn.TransformerEncoderLayer``) it keeps whole, taken at its path
from the model the plan's model file builds on the meta device. Here: where that model file is
(:func:`model_file_of`), and the check at emit time that it builds those modules
(:func:`check_whole`).

Tests: tests/stages/test_emit_leaf.py.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from autopipe.errors import EmitError
from autopipe.model.load import load_model
from autopipe.model.spec import parse_kwargs
from autopipe.plans import Plan
from autopipe.stages.check import IN_MEMORY
from autopipe.stages.source import ModelFile

__all__ = ["check_whole", "model_file_of"]


def model_file_of(plan: Plan, base: str | Path | None = None) -> ModelFile | None:
    """The plan's model file as emitted stages name it (absolute); None for a plan made in Python."""
    recipe = plan.recipe
    if recipe.model_file in IN_MEMORY:
        return None
    path = Path(recipe.model_file)
    if not path.is_absolute() and base is not None and (Path(base) / path).exists():
        path = Path(base) / path
    return ModelFile(str(path.resolve()), recipe.factory, recipe.model_kwargs)


def check_whole(model_file: ModelFile, whole: dict[int, tuple[nn.Module, dict[str, str]]]) -> None:
    """EmitError unless the model ``model_file`` builds (on meta) has each module kept whole at its
    path, of its class and with its tensors' shapes: what the emitted stages will take from it.
    ``whole``: stage index -> (the stage's module, its kept modules: path -> class name)."""
    built = load_model(f"{model_file.path}:{model_file.factory}", parse_kwargs(model_file.kwargs), device="meta")
    for index, (stage, kept) in whole.items():
        for path, cls in kept.items():
            ours = stage.get_submodule(path)
            try:
                theirs = built.model.get_submodule(path)
            except AttributeError:
                theirs = None
            shapes = {k: tuple(v.shape) for k, v in ours.state_dict(keep_vars=True).items()}
            if (
                theirs is None
                or type(theirs).__name__ != cls
                or {k: tuple(v.shape) for k, v in theirs.state_dict(keep_vars=True).items()} != shapes
            ):
                raise EmitError(
                    f"stage {index} keeps module {path} ({cls}) whole, built from {model_file.path}, whose "
                    f"{model_file.factory}() has no such module of that shape; emit the model that file builds"
                )
