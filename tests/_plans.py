"""Plans for tests, made without profiling: the traced blocks cut evenly into stages.

Profiling takes seconds per model; tests of emit/export only need a valid cut, so they build
the Plan straight from a trace (every prediction field is zero).
"""

from __future__ import annotations

from pathlib import Path

import torch

from autopipe.load import load_model, parse_kwargs
from autopipe.plans import Plan, StagePlan
from autopipe.trace import trace_model

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"


def even_plan(
    model: str,
    kwargs: tuple[str, ...] = (),
    *,
    stages: int = 2,
    virtual: int = 1,
    schedule: str = "1f1b",
    micro_batches: int = 2,
    micro_batch_size: int = 2,
    tracer: str = "auto",
    device: str | None = None,
    leaf_modules: tuple[str, ...] = (),
) -> Plan:
    """``model`` is a file name in models/ (``"gpt.py"``) or a path."""
    path = MODELS / model if "/" not in model else Path(model)
    torch.manual_seed(0)
    loaded = load_model(str(path), parse_kwargs(kwargs), device=device)
    traced = trace_model(
        loaded.model, loaded.make_inputs(micro_batch_size), micro_batch_size=micro_batch_size, tracer=tracer,
        leaf_modules=leaf_modules,
    )
    n, parts = traced.num_blocks, stages * virtual
    if n < parts:
        raise ValueError(f"{model} has {n} blocks, fewer than {parts} stages")
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    stage_plans = []
    for i in range(parts):
        blocks = traced.blocks[bounds[i] : bounds[i + 1]]
        stage_plans.append(
            StagePlan(
                index=i, rank=i % stages, blocks=tuple(b.name for b in blocks),
                block_indices=tuple(b.index for b in blocks), nodes=tuple(x for b in blocks for x in b.nodes),
                params=0, forward_s=0.0, backward_s=0.0, backward_input_s=0.0, backward_weight_s=0.0,
                recompute=False, memory_bytes=0.0, static_bytes=0.0, activation_bytes=0.0, held_bytes=0.0,
                send_bytes=0.0,
            )
        )
    return Plan(
        model=f"{path}:build_model", model_file=str(path), factory="build_model", model_kwargs=tuple(kwargs),
        tracer=traced.tracer, leaf_modules=leaf_modules, max_blocks=None, fingerprint=traced.fingerprint(),
        profile_device="cpu", devices=stages, virtual=virtual, schedule=schedule, micro_batches=micro_batches,
        micro_batch_size=micro_batch_size, batch_size=micro_batches * micro_batch_size, memory_limit_bytes=2.0**30,
        link_bandwidth=1e9, link_latency_s=0.0, recompute_policy="never", stages=tuple(stage_plans),
        iteration_time_s=0.0, bubble_fraction=0.0, throughput=0.0, peak_memory_bytes=(0.0,) * stages,
        alternatives=(), baselines=(),
    )  # fmt: skip
