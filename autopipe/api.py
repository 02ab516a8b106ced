"""The programmatic entry points: profile, plan and emit a model from Python.

    import autopipe
    plan = autopipe.plan("models/gpt.py", kwargs={"n_layer": 8}, stages=2, batch_size=8, memory="1GiB")
    plan.save("plan.json")                         # autopipe run plan.json / autopipe emit plan.json

    plan = autopipe.plan(model, x, loss_fn=loss, example_targets=y, stages=4, batch_size=32)
    autopipe.emit(plan, model, "stages/", example_inputs=x)

The model is either a **model file** -- ``"path/to/model.py"`` or ``"path/to/model.py:factory"``
with the factory's ``kwargs``, loaded as ``autopipe plan`` loads it (its ``example_inputs``,
``example_targets`` and ``loss_fn``) -- or an **nn.Module** you hold, with ``example_inputs``
(a function ``batch_size -> inputs``, or one batch: a tensor, tuple or dict of tensors whose
first dimension is the batch, sliced to the micro-batch sizes measured), optionally
``example_targets`` (the same two forms) and ``loss_fn(output, targets)`` (default: the mean
of the output), whose cost is measured on the last block as the command line does.

A plan of a model file records the file, factory and kwargs, so the command line rebuilds it.
A plan of an in-memory module names no model file (its recipe's ``model_file`` is ""): it runs
and emits in Python, with the module (:func:`emit` here; ``autopipe.pipeline(plan, model)``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autopipe.costs.measured import profile_model
from autopipe.costs.profile import Profile
from autopipe.errors import AutopipeError, EmitError, ModelLoadError, PlanError
from autopipe.graph.recipe import TraceRecipe
from autopipe.graph.trace import trace_model
from autopipe.model.load import LoadedModel, ModelSpec, check_model_runs, default_loss, load_model
from autopipe.model.usercode import exception_summary
from autopipe.planner.balance import plan_balance
from autopipe.planner.defaults import plan_micro_batch_sizes, plan_request
from autopipe.planner.search import plan_pipeline
from autopipe.plans import Plan
from autopipe.stages.emit import emit as emit_rebuilt
from autopipe.stages.emit import emit_stages
from autopipe.units import parse_bytes

__all__ = ["emit", "fingerprint_of", "plan", "plan_profile", "profile"]

Batch = Callable[[int], Any] | Any  # a function batch_size -> batch, or one batch to slice
ModelArg = nn.Module | str | os.PathLike[str]  # an nn.Module, or "path/to/model.py[:factory]"
LossFn = Callable[[Any, Any], torch.Tensor]


def _maker(batch: Batch) -> Callable[[int], Any]:
    if callable(batch) and not isinstance(batch, torch.Tensor):
        return batch

    def make(u: int) -> Any:
        return torch.utils._pytree.tree_map(lambda t: t[:u] if isinstance(t, torch.Tensor) else t, batch)

    return make


def _batch_of(batch: Batch | None) -> int | None:
    """How many samples one given batch holds (None: a function, or nothing given)."""
    if batch is None or (callable(batch) and not isinstance(batch, torch.Tensor)):
        return None
    leaves = [t for t in torch.utils._pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
    return int(leaves[0].shape[0]) if leaves and leaves[0].dim() > 0 else None


def _check_samples(name: str, batch: Batch | None, needed: int, what: str) -> None:
    available = _batch_of(batch)
    if available is not None and needed > available:
        raise PlanError(
            f"{name} holds {available} samples but {what} {needed} was asked; pass a larger batch or a function batch_size -> {name[8:]}"
        )


def _source_of(model: nn.Module) -> Path:
    """The file that defines the module's class (for messages that point at the user's line)."""
    try:
        return Path(inspect.getfile(type(model)))
    except (TypeError, OSError):
        return Path("<model>")


def _checked_loss(fn: Callable[..., Any], source: Path) -> LossFn:
    """``loss_fn`` as the profiler and executor call it: one line when it raises or returns no tensor."""

    def loss(output: object, targets: object) -> torch.Tensor:
        try:
            value = fn(output, targets)
        except AutopipeError:
            raise
        except Exception as e:
            raise ModelLoadError(f"loss_fn raised {exception_summary(e, source)}") from e
        if not isinstance(value, torch.Tensor):
            raise ModelLoadError(f"loss_fn returned a {type(value).__name__}, not a Tensor; return a scalar tensor")
        return value

    return loss


def _in_memory(model: nn.Module, example_inputs: Batch | None, loss_fn: Callable[..., Any] | None, example_targets: Batch | None) -> LoadedModel:
    if example_inputs is None:
        raise PlanError(
            f"example_inputs are needed to trace the {type(model).__name__} module: pass one batch or a function batch_size -> inputs"
        )
    if loss_fn is not None and not callable(loss_fn):
        raise PlanError(f"loss_fn must be a function (output, targets) -> Tensor, not a {type(loss_fn).__name__}")
    source = _source_of(model)
    return LoadedModel(
        spec=ModelSpec(source, type(model).__name__, {}),
        model=model,
        make_inputs=_maker(example_inputs),
        make_targets=None if example_targets is None else _maker(example_targets),
        loss_fn=default_loss if loss_fn is None else _checked_loss(loss_fn, source),
        has_targets=example_targets is not None,
    )


def _from_file(model: str | os.PathLike[str], kwargs: Mapping[str, object] | None, given: Mapping[str, object], device: str) -> LoadedModel:
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
            f"kwargs[{k!r}] is a {type(spec.kwargs[k]).__name__}, which a plan cannot record (only Python literals: numbers, "
            "strings, bools, None, tuples, lists, dicts); pass literals the factory turns into objects, or pass the built nn.Module"
        )
    return load_model(text, spec.kwargs, device=device)


def _load(
    model: ModelArg,
    example_inputs: Batch | None,
    kwargs: Mapping[str, object] | None,
    loss_fn: Callable[..., Any] | None,
    example_targets: Batch | None,
    device: str,
) -> LoadedModel:
    if isinstance(model, nn.Module):
        if kwargs:
            raise PlanError("kwargs are for a model file's factory, and model is a built nn.Module; drop kwargs or pass the model file's path")
        return _in_memory(model, example_inputs, loss_fn, example_targets)
    if isinstance(model, (str, os.PathLike)):
        given = {"example_inputs": example_inputs, "loss_fn": loss_fn, "example_targets": example_targets}
        return _from_file(model, kwargs, given, device)
    raise PlanError(f"model must be an nn.Module or a model file path ('path/to/model.py[:factory]'), not a {type(model).__name__}")


def profile(
    model: ModelArg,
    example_inputs: Batch | None = None,
    *,
    kwargs: Mapping[str, object] | None = None,
    loss_fn: Callable[..., Any] | None = None,
    example_targets: Batch | None = None,
    micro_batch_sizes: Sequence[int] = (1, 2, 4),
    tracer: str = "auto",
    leaf_modules: Sequence[str] = (),
    max_blocks: int | None = None,
    device: str = "cpu",
    warmup: int = 2,
    repeat: int = 5,
) -> Profile:
    """Measure every block of ``model`` (a model file or an nn.Module; see ``autopipe profile``)."""
    needed = max(micro_batch_sizes, default=1)
    _check_samples("example_inputs", example_inputs, needed, "micro-batch size")
    _check_samples("example_targets", example_targets, needed, "micro-batch size")
    loaded = _load(model, example_inputs, kwargs, loss_fn, example_targets, device)
    check_model_runs(loaded, needed)
    prof = profile_model(
        loaded,
        micro_batch_sizes=micro_batch_sizes,
        recipe=TraceRecipe(tracer=tracer, leaf_modules=tuple(leaf_modules), max_blocks=max_blocks),
        warmup=warmup,
        repeat=repeat,
        device=device,
    )
    if isinstance(model, nn.Module):  # nothing to rebuild it from: the recipe names no file
        prof = replace(prof, model=f"{type(model).__name__} (in memory)", recipe=replace(prof.recipe, model_file=""))
    return prof


def plan(
    model: ModelArg,
    example_inputs: Batch | None = None,
    *,
    kwargs: Mapping[str, object] | None = None,
    loss_fn: Callable[..., Any] | None = None,
    example_targets: Batch | None = None,
    stages: int | None = None,
    memory: float | str | None = None,
    batch_size: int,
    micro_batches: int | None = None,
    schedule: str | None = None,
    virtual: int | None = None,
    recompute: str = "auto",
    link_bandwidth: float | None = None,
    link_latency_s: float | None = None,
    action_overhead_s: float | None = None,
    profile_data: Profile | None = None,
    **profile_options: Any,
) -> Plan:
    """Profile ``model`` (unless ``profile_data`` is given) and plan its pipeline.

    ``model`` is a model file (``"path/to/model.py[:factory]"`` with ``kwargs``) or an
    nn.Module with ``example_inputs`` (and optionally ``loss_fn``, ``example_targets``).
    ``stages`` counts pipeline devices and ``memory`` is the limit per device; left out,
    both take ``autopipe plan``'s defaults (:mod:`autopipe.planner.defaults`), as do the link,
    the cost per action and the micro-batch sizes profiled.
    """
    prof = profile_data
    if prof is None:
        sizes = profile_options.pop("micro_batch_sizes", None)
        if sizes is None:
            given = [n for n in (_batch_of(example_inputs), _batch_of(example_targets)) if n is not None]
            sizes = plan_micro_batch_sizes(batch_size, min(given) if given else None)
        prof = profile(
            model, example_inputs, kwargs=kwargs, loss_fn=loss_fn, example_targets=example_targets,
            micro_batch_sizes=sizes, **profile_options,
        )  # fmt: skip
    request = plan_request(
        prof,
        devices=stages,
        batch_size=batch_size,
        memory_limit=None if memory is None else parse_bytes(memory, "memory"),
        micro_batches=micro_batches,
        schedule=schedule,
        virtual=virtual,
        recompute=recompute,
        link_bandwidth=link_bandwidth,
        link_latency_s=link_latency_s,
        action_overhead_s=action_overhead_s,
    )
    return plan_pipeline(prof, request)


def plan_profile(
    profile: Profile | str | os.PathLike[str],
    *,
    stages: int,
    batch_size: int,
    memory: float | str,
    schedule: str | None = None,
    micro_batches: int | None = None,
    recompute: str = "auto",
    virtual: int | None = None,
    balance: Sequence[int] | None = None,
) -> Plan:
    """Plan from a saved Profile (or the path of its JSON), as ``autopipe plan --profile``.

    Without ``balance`` it searches; with ``balance`` (blocks per chunk in chunk order: S
    entries for one-chunk schedules, S·v for interleaved and V schedules, which then need
    ``schedule``; S entries and no ``schedule`` try the one-chunk schedules only) the plan
    is that split, priced by the same function the search prices every split with, and
    autopipe's best for the same request is its first baseline, named ``autopipe``.
    """
    if isinstance(profile, (str, os.PathLike)):
        prof = Profile.load(Path(profile))
    elif isinstance(profile, Profile):
        prof = profile
    else:
        raise PlanError(f"profile must be a Profile or the path of a profile JSON, not a {type(profile).__name__}")
    request = plan_request(
        prof, devices=stages, batch_size=batch_size, memory_limit=parse_bytes(memory, "memory"),
        micro_batches=micro_batches, schedule=schedule, virtual=virtual, recompute=recompute,
    )  # fmt: skip
    if balance is None:
        return plan_pipeline(prof, request)
    return plan_balance(prof, request, balance, flag="balance")


def emit(
    plan: Plan,
    model: nn.Module | None,
    folder: str | Path,
    *,
    example_inputs: Batch | None = None,
    force: bool = False,
    weights: bool = True,
    weights_format: str = "pt",
) -> dict[str, Any]:
    """Write ``plan``'s stages as standalone folders into ``folder`` (as ``autopipe emit``);
    returns the manifest.

    ``model`` is the nn.Module the plan was made for, split with its own weights; it needs
    ``example_inputs`` (one batch, or a function batch_size -> inputs) to trace it at the
    plan's micro-batch size. ``model=None`` rebuilds the plan's model from its model file,
    as ``autopipe emit`` does (seeded weights).
    """
    dest = Path(folder)
    if not force and dest.is_dir() and any(dest.iterdir()):  # as check_destination, in this API's words
        raise EmitError(f"{dest} is not empty; emit into a new folder or pass force=True to replace it")
    if model is None:
        if example_inputs is not None:
            raise PlanError("example_inputs come from the plan's model file when model is None; drop them, or pass the nn.Module")
        return emit_rebuilt(plan, folder, force=force, weights=weights, weights_format=weights_format)
    if not isinstance(model, nn.Module):
        raise PlanError(f"model must be the nn.Module the plan was made for (or None: rebuild it from its model file), not a {type(model).__name__}")
    if example_inputs is None:
        raise PlanError(
            f"emitting the {type(model).__name__} module needs example_inputs (one batch, or a function batch_size -> inputs) "
            f"to trace it at the plan's micro-batch size {plan.micro_batch_size}"
        )
    if weights and any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        raise PlanError(f"the {type(model).__name__} module is on the meta device, so it has no weights to write; pass weights=False")
    _check_samples("example_inputs", example_inputs, plan.micro_batch_size, "the plan's micro-batch size")
    inputs = _maker(example_inputs)(plan.micro_batch_size)
    return emit_stages(plan, model, inputs, folder, force=force, weights=weights, weights_format=weights_format, source=_source_of(model))


def fingerprint_of(loaded: LoadedModel, prof: Profile) -> str:
    """The fingerprint ``loaded`` gets when traced the way ``prof`` was (to match the two)."""
    u = min(prof.micro_batch_sizes) if prof.micro_batch_sizes else 1
    traced = trace_model(loaded.model, loaded.make_inputs(u), micro_batch_size=u, recipe=prof.recipe, source=loaded.spec.path)
    return traced.fingerprint()
