"""A model given from Python: a model file (with its factory's kwargs) or an nn.Module you hold.

``autopipe.profile``/``plan``/``emit`` (:mod:`autopipe.api`) load what they are given here: a
model file as ``autopipe plan`` loads it, an nn.Module with its ``example_inputs`` (a function
``batch_size -> inputs``, or one batch sliced to the micro-batch sizes), ``example_targets``
and ``loss_fn`` (default: the mean of the output).

Tests: tests/test_api.py.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autopipe.errors import ModelLoadError, PlanError
from autopipe.model.load import LoadedModel, ModelSpec, default_loss, load_model
from autopipe.model.usercode import guarded

__all__ = ["Batch", "LossFn", "ModelArg", "batch_of", "check_samples", "load_given", "maker", "source_of"]

Batch = Callable[[int], Any] | Any  # a function batch_size -> batch, or one batch to slice
ModelArg = nn.Module | str | os.PathLike[str]  # an nn.Module, or "path/to/model.py[:factory]"
LossFn = Callable[[Any, Any], torch.Tensor]


def maker(batch: Batch, name: str = "example_inputs") -> Callable[[int], Any]:
    """batch_size -> one batch: slices of the batch given, or the caller's function, called under the
    guard (what it raises is one line naming ``name``)."""
    if callable(batch) and not isinstance(batch, torch.Tensor):
        fn = batch
        source = _function_file(fn)

        def call(u: int) -> Any:
            with guarded(f"{name}({u})", source):
                return fn(u)

        return call

    def make(u: int) -> Any:
        return torch.utils._pytree.tree_map(lambda t: t[:u] if isinstance(t, torch.Tensor) else t, batch)

    return make


def batch_of(batch: Batch | None) -> int | None:
    """How many samples one given batch holds (None: a function, or nothing given)."""
    if batch is None or (callable(batch) and not isinstance(batch, torch.Tensor)):
        return None
    leaves = [t for t in torch.utils._pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
    return int(leaves[0].shape[0]) if leaves and leaves[0].dim() > 0 else None


def check_samples(name: str, batch: Batch | None, needed: int, what: str) -> None:
    available = batch_of(batch)
    if available is not None and needed > available:
        raise PlanError(
            f"{name} holds {available} samples but {what} {needed} was asked; pass a larger batch "
            f"or a function batch_size -> {name[8:]}"
        )


def _function_file(fn: Callable[..., Any]) -> Path:
    try:
        return Path(inspect.getfile(fn))
    except (TypeError, OSError):
        return Path("<function>")


def source_of(model: nn.Module) -> Path:
    """The file that defines the module's class (for messages that point at the user's line)."""
    try:
        return Path(inspect.getfile(type(model)))
    except (TypeError, OSError):
        return Path("<model>")


def _checked_loss(fn: Callable[..., Any], source: Path) -> LossFn:
    """``loss_fn`` as the profiler and executor call it: one line when it raises or returns no tensor."""

    def loss(output: object, targets: object) -> torch.Tensor:
        with guarded("loss_fn", source, timed=False):  # called each step; the run's timeout bounds it
            value = fn(output, targets)
        if not isinstance(value, torch.Tensor):
            raise ModelLoadError(f"loss_fn returned a {type(value).__name__}, not a Tensor; return a scalar tensor")
        return value

    return loss


def _in_memory(
    model: nn.Module, example_inputs: Batch | None, loss_fn: Callable[..., Any] | None, example_targets: Batch | None
) -> LoadedModel:
    if example_inputs is None:
        raise PlanError(
            f"example_inputs are needed to trace the {type(model).__name__} module: pass one batch "
            "or a function batch_size -> inputs"
        )
    if loss_fn is not None and not callable(loss_fn):
        raise PlanError(f"loss_fn must be a function (output, targets) -> Tensor, not a {type(loss_fn).__name__}")
    source = source_of(model)
    return LoadedModel(
        spec=ModelSpec(source, type(model).__name__, {}),
        model=model,
        make_inputs=maker(example_inputs),
        make_targets=None if example_targets is None else maker(example_targets, "example_targets"),
        loss_fn=default_loss if loss_fn is None else _checked_loss(loss_fn, source),
        has_targets=example_targets is not None,
    )


def _from_file(
    model: str | os.PathLike[str], kwargs: Mapping[str, object] | None, given: Mapping[str, object], device: str
) -> LoadedModel:
    text = os.fspath(model)
    spec = ModelSpec.parse(text, kwargs)
    for name, value in given.items():
        if value is not None:
            raise PlanError(
                f"{name} comes from the model file {spec.path} (define it there), so do not pass it with a model file; "
                "or pass the built nn.Module with your own"
            )
    unwritable = spec.unwritable_kwargs()
    if unwritable:
        k = unwritable[0]
        raise PlanError(
            f"kwargs[{k!r}] is a {type(spec.kwargs[k]).__name__}, which a plan cannot record "
            "(only Python literals: numbers, "
            "strings, bools, None, tuples, lists, dicts); pass literals the factory turns into objects, "
            "or pass the built nn.Module"
        )
    return load_model(text, spec.kwargs, device=device)


def load_given(
    model: ModelArg,
    example_inputs: Batch | None,
    kwargs: Mapping[str, object] | None,
    loss_fn: Callable[..., Any] | None,
    example_targets: Batch | None,
    device: str,
) -> LoadedModel:
    if isinstance(model, nn.Module):
        if kwargs:
            raise PlanError(
                "kwargs are for a model file's factory, and model is a built nn.Module; drop kwargs "
                "or pass the model file's path"
            )
        return _in_memory(model, example_inputs, loss_fn, example_targets)
    if isinstance(model, (str, os.PathLike)):
        given = {"example_inputs": example_inputs, "loss_fn": loss_fn, "example_targets": example_targets}
        return _from_file(model, kwargs, given, device)
    raise PlanError(
        f"model must be an nn.Module or a model file path ('path/to/model.py[:factory]'), not a {type(model).__name__}"
    )
