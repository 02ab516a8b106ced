"""Plans for tests, made without profiling: the traced blocks cut evenly into stages.

Profiling takes seconds per model; tests of the executor, emit and export only need a valid
cut, so they build the Plan straight from a trace (predictions are nominal: 1 ms forwards).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from autopipe.graph.recipe import TraceRecipe
from autopipe.graph.trace import trace_model
from autopipe.model.load import load_model, parse_kwargs
from autopipe.plans import Plan, StagePlan

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


def even_plan(
    model: str,
    kwargs: Mapping[str, object] | Sequence[str] = (),
    *,
    stages: int = 2,
    schedule: str = "1f1b",
    virtual: int = 1,
    micro_batches: int = 2,
    micro_batch_size: int = 2,
    recompute: Sequence[int] = (),
    tracer: str = "auto",
    device: str | None = None,
    leaf_modules: Sequence[str] = (),
) -> Plan:
    """A plan that cuts ``model``'s blocks evenly into ``stages * virtual`` stages.

    ``model``: a path, or a file name in models/ (``"gpt.py"``) where no such path exists here;
    ``kwargs``: the factory's keyword arguments, as a mapping or as ``"key=value"`` strings;
    ``recompute``: the indices of the stages to recompute.
    """
    path = Path(model) if Path(model).exists() or "/" in model else MODELS / model
    if isinstance(kwargs, Mapping):
        given = dict(kwargs)
        words = tuple(f"{k}={v!r}" for k, v in given.items())
    else:
        words = tuple(kwargs)
        given = parse_kwargs(list(words))
    torch.manual_seed(0)
    loaded = load_model(str(path), given, device=device)
    recipe = TraceRecipe(model_file=str(path), model_kwargs=words, tracer=tracer, leaf_modules=tuple(leaf_modules))
    traced = trace_model(
        loaded.model, loaded.make_inputs(micro_batch_size), micro_batch_size=micro_batch_size,
        recipe=recipe, source=loaded.spec.path,
    )  # fmt: skip
    n, parts = traced.num_blocks, stages * virtual
    if n < parts:
        raise ValueError(f"{model} has {n} blocks, fewer than {parts} stages")
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    stage_plans = []
    for j in range(parts):
        mine = traced.blocks[bounds[j] : bounds[j + 1]]
        stage_plans.append(
            StagePlan(
                index=j, rank=j % stages, blocks=tuple(b.name for b in mine),
                block_indices=tuple(b.index for b in mine), nodes=tuple(x for b in mine for x in b.nodes),
                params=0, forward_s=1e-3, backward_s=2e-3, backward_input_s=1e-3, backward_weight_s=1e-3,
                recompute=j in recompute, memory_bytes=0.0, static_bytes=0.0, activation_bytes=0.0,
                held_bytes=0.0, send_bytes=0.0,
            )
        )  # fmt: skip
    return Plan(
        model=f"{path}:build_model", recipe=dataclasses.replace(recipe, tracer=traced.tracer, fingerprint=traced.fingerprint()),
        profile_device="cpu", devices=stages, virtual=virtual, schedule=schedule, micro_batches=micro_batches,
        micro_batch_size=micro_batch_size, batch_size=micro_batches * micro_batch_size, memory_limit_bytes=2.0**30,
        link_bandwidth=1e9, link_latency_s=0.0, recompute_policy="never", stages=tuple(stage_plans),
        iteration_time_s=1e-2, bubble_fraction=0.2, throughput=1.0, peak_memory_bytes=(1e6,) * stages,
        alternatives=(), baselines=(),
    )  # fmt: skip
