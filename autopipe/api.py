"""The programmatic entry points: profile and plan a model you already hold in Python.

    import autopipe
    plan = autopipe.plan(model, example_inputs, stages=4, memory="16GiB", batch_size=32)
    print(plan.summary()); plan.save("plan.json")

``example_inputs`` is either a function ``batch_size -> inputs`` or one batch of inputs (a
tensor, tuple or dict of tensors whose first dimension is the batch), which is sliced to the
micro-batch sizes that are measured.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autopipe.costs.measured import profile_model
from autopipe.costs.profile import Profile
from autopipe.errors import PlanError
from autopipe.graph.recipe import TraceRecipe
from autopipe.graph.trace import trace_model
from autopipe.model.load import LoadedModel, ModelSpec, default_loss
from autopipe.plans import Plan
from autopipe.solve.defaults import plan_micro_batch_sizes, plan_request
from autopipe.solve.search import plan_pipeline
from autopipe.units import parse_bytes

__all__ = ["fingerprint_of", "plan", "profile"]

Inputs = Callable[[int], Any] | Any


def _loaded(model: nn.Module, example_inputs: Inputs) -> LoadedModel:
    if callable(example_inputs) and not isinstance(example_inputs, torch.Tensor):
        make = example_inputs
    else:
        batch = example_inputs

        def make(u: int) -> Any:
            return torch.utils._pytree.tree_map(lambda t: t[:u] if isinstance(t, torch.Tensor) else t, batch)

    try:
        source = Path(inspect.getfile(type(model)))
    except (TypeError, OSError):
        source = Path("<model>")
    spec = ModelSpec(source, type(model).__name__, {})
    return LoadedModel(spec=spec, model=model, make_inputs=make, make_targets=None, loss_fn=default_loss, has_targets=False)


def _batch_of(example_inputs: Inputs) -> int | None:
    if callable(example_inputs) and not isinstance(example_inputs, torch.Tensor):
        return None
    leaves = [t for t in torch.utils._pytree.tree_leaves(example_inputs) if isinstance(t, torch.Tensor)]
    return int(leaves[0].shape[0]) if leaves and leaves[0].dim() > 0 else None


def profile(
    model: nn.Module,
    example_inputs: Inputs,
    *,
    micro_batch_sizes: Sequence[int] = (1, 2, 4),
    tracer: str = "auto",
    leaf_modules: Sequence[str] = (),
    max_blocks: int | None = None,
    device: str = "cpu",
    warmup: int = 2,
    repeat: int = 5,
) -> Profile:
    """Measure every block of ``model`` (see ``autopipe profile``)."""
    available = _batch_of(example_inputs)
    if available is not None and max(micro_batch_sizes) > available:
        raise PlanError(
            f"example_inputs hold {available} samples but micro-batch size {max(micro_batch_sizes)} was asked; "
            "pass a larger batch or a function batch_size -> inputs"
        )
    loaded = _loaded(model, example_inputs)
    return profile_model(
        loaded,
        micro_batch_sizes=micro_batch_sizes,
        recipe=TraceRecipe(tracer=tracer, leaf_modules=tuple(leaf_modules), max_blocks=max_blocks),
        warmup=warmup,
        repeat=repeat,
        device=device,
    )


def plan(
    model: nn.Module,
    example_inputs: Inputs,
    *,
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

    ``stages`` counts pipeline devices and ``memory`` is the limit per device; left out,
    both take ``autopipe plan``'s defaults (:mod:`autopipe.solve.defaults`), as do the link,
    the cost per action and the micro-batch sizes profiled.
    """
    prof = profile_data
    if prof is None:
        sizes = profile_options.pop("micro_batch_sizes", None)
        if sizes is None:
            sizes = plan_micro_batch_sizes(batch_size, _batch_of(example_inputs))
        prof = profile(model, example_inputs, micro_batch_sizes=sizes, **profile_options)
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


def fingerprint_of(loaded: LoadedModel, prof: Profile) -> str:
    """The fingerprint ``loaded`` gets when traced the way ``prof`` was (to match the two)."""
    u = min(prof.micro_batch_sizes) if prof.micro_batch_sizes else 1
    traced = trace_model(loaded.model, loaded.make_inputs(u), micro_batch_size=u, recipe=prof.recipe, source=loaded.spec.path)
    return traced.fingerprint()
