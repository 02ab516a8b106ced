"""Rebuild a plan's model and re-trace it into the plan's blocks.

A Plan's recipe (:class:`~autopipe.graph.recipe.TraceRecipe`) records how its model was made
(model file, factory, kwargs) and traced (tracer, leaf modules, block limit), plus the trace's
fingerprint. ``emit`` and ``export`` rebuild the model from that recipe, trace it again at the plan's
micro-batch size and check the plan against the trace (:mod:`autopipe.stages.check`), so the plan's stages
are the trace's blocks before anything is cut.

Weights: a rebuilt model is seeded with ``torch.manual_seed(0)`` before its factory runs (the
same weights every time), unless they come from a ``state_dict`` file; ``meta=True`` builds it
on the meta device (shapes only, nothing materialised).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from autopipe._io import refused_pickle
from autopipe.errors import (
    FactoryArgumentError,
    ModelLoadError,
    PlanError,
    PlanFileError,
    TraceError,
)
from autopipe.graph.trace import TracedModel, trace_model
from autopipe.model.load import LoadedModel, load_model
from autopipe.plans import Plan
from autopipe.stages.check import IN_MEMORY, check_plan, replan_hint

__all__ = ["IN_MEMORY", "SEED", "check_rebuildable", "rebuild_model", "trace_for_plan"]

SEED = 0


def rebuild_model(
    plan: Plan,
    *,
    weights: str | Path | None = None,
    meta: bool = False,
    base: str | Path | None = None,
    seed: int = SEED,
) -> LoadedModel:
    """Build the plan's model again from its recipe's model file, factory and kwargs.

    ``base`` is the folder of the plan file: a relative ``model_file`` is looked up there first,
    then from the working directory (where older plans recorded it;
    :mod:`autopipe.graph.model_file`). ``Plan.load`` has done so already for a plan it read.
    """
    check_rebuildable(plan)
    model = plan.recipe.model_spec()
    path = model.path
    if base is not None and not path.is_absolute():
        beside = Path(base) / path
        if beside.exists():
            path = beside
        elif not path.exists():
            raise ModelLoadError(
                f"model file not found: {path} (looked in the plan's folder {base} and in {Path.cwd()}); "
                "move it back beside the plan, or plan again"
            )
    spec = f"{path}:{model.factory}"
    kwargs = dict(model.kwargs)
    if meta and weights is not None:
        raise PlanError("weights from a file and a meta (structure-only) model contradict each other; drop one")
    if not meta:
        torch.manual_seed(seed)
    try:
        loaded = load_model(spec, kwargs, device="meta" if meta else None)
    except FactoryArgumentError as e:
        raise _cannot_rebuild(plan, e) from None
    if weights is not None:
        _load_weights(loaded.model, Path(weights))
    return loaded


def check_rebuildable(plan: Plan) -> None:
    """Raise PlanError, before anything is imported, when the plan names no model file to
    rebuild its model from (it was planned from an in-memory module) or names it unreadably."""
    recipe = plan.recipe
    if recipe.model_file in IN_MEMORY:
        raise PlanError(_in_memory_message(recipe.factory))
    if not recipe.factory.isidentifier():
        raise PlanFileError(
            f"the plan's factory {recipe.factory!r} is not a Python function name; the plan file is damaged, plan again"
        )
    seen: set[str] = set()
    for item in recipe.model_kwargs:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip().isidentifier() or key.strip() in seen:
            what = "is given twice" if sep and key.strip() in seen else "is not key=value"
            raise PlanFileError(f"the plan's model kwarg {item!r} {what}; the plan file is damaged, plan again")
        seen.add(key.strip())


def _in_memory_message(name: str) -> str:
    module = f"an in-memory {name} module" if name.isidentifier() else "an in-memory module"
    return (
        f"the plan was made by autopipe.plan() from {module}, which the command line cannot rebuild; "
        "in Python, run it with autopipe.pipeline(plan, model) or emit it with autopipe.emit(plan, model, folder, "
        "example_inputs=...), or plan a model file: autopipe plan MODEL.py -k key=value "
        "(autopipe.plan('MODEL.py', kwargs=...))"
    )


def _cannot_rebuild(plan: Plan, e: FactoryArgumentError) -> PlanError:
    """What to do when the plan's recorded kwargs do not fit its factory: a class planned in
    memory (older plans named its class and no kwargs), or a model file changed since."""
    model = plan.recipe.model_spec()
    if e.is_class and not model.kwargs:
        return PlanError(_in_memory_message(e.factory))
    if e.unknown:
        problem = f"{e.factory}() in {model.path} does not take {', '.join(e.unknown)}, which the plan records"
        again = f"autopipe plan {model.path}:{model.factory}"
    else:
        problem = f"{e.factory}() in {model.path} needs {', '.join(e.missing)}, which the plan does not record"
        again = f"autopipe plan {model} " + " ".join(f"-k {k}=VALUE" for k in e.missing)
    return PlanError(f"{problem} (the model file changed since it was planned?); plan it again: {again}")


def _load_weights(model: nn.Module, path: Path) -> None:
    if not path.is_file():
        raise ModelLoadError(
            f"weights file not found: {path}; give a state_dict saved with torch.save(model.state_dict(), ...)"
        )
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a corrupt file, or a pickle of something other than tensors
        if (refused := refused_pickle(e)) is not None:  # torch's advice (weights_only=False) would run it
            raise ModelLoadError(
                f"weights file {path} holds pickled Python objects or code ({refused}), not only tensors; "
                "refused, as loading it could run code; give a state_dict saved with "
                "torch.save(model.state_dict(), ...)"
            ) from None
        raise ModelLoadError(
            f"cannot read weights from {path} ({type(e).__name__}: {str(e)[:120]}); "
            "save model.state_dict() with torch.save"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ModelLoadError(
            f"{path} holds a {type(state).__name__}, not a state_dict; save model.state_dict() with torch.save"
        )
    want = set(model.state_dict())
    missing, extra = sorted(want - set(state))[:3], sorted(set(state) - want)[:3]
    if missing or extra:
        raise ModelLoadError(
            f"{path} does not fit the plan's model (missing {missing}, unexpected {extra}); "
            "give the state_dict of the model the plan was made for"
        )
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[-1].strip()
        raise ModelLoadError(
            f"{path} does not fit the plan's model ({first[:200]}); "
            "give the state_dict of the model the plan was made for"
        ) from None


def trace_for_plan(plan: Plan, model: nn.Module, inputs: Any, source: Path | None = None) -> TracedModel:
    """Trace ``model`` on one micro-batch ``inputs`` as the plan was traced; check the plan
    against the trace (:func:`~autopipe.stages.check.check_plan`: the fingerprint, every block
    on one stage, whole, in order), PlanError naming the stage otherwise.

    (Tracing leaves the model's buffers, BatchNorm statistics included, as they were.)
    """
    try:
        traced = trace_model(model, inputs, micro_batch_size=plan.micro_batch_size, recipe=plan.recipe, source=source)
    except TraceError as e:  # it traced when planned: the model changed since (its advice is for autopipe plan)
        raise TraceError(
            f"the model no longer traces as it did when planned: {e}; when it is fixed, {replan_hint(plan)}"
        ) from None
    check_plan(plan, traced)
    return traced
