"""Helpers for the runtime tests: plans without profiling, and the single-process reference."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from autopipe.load import call_model, load_model
from autopipe.plans import Plan, StagePlan
from autopipe.trace import trace_model


def even_plan(
    model_file: str,
    kwargs: Mapping[str, object],
    *,
    stages: int,
    schedule: str,
    virtual: int = 1,
    micro_batches: int = 4,
    batch_size: int = 8,
    recompute: Sequence[int] = (),
    tracer: str = "auto",
    leaf_modules: Sequence[str] = (),
) -> Plan:
    """A plan that cuts ``model_file``'s blocks evenly into ``stages * virtual`` stages."""
    lm = load_model(model_file, dict(kwargs))
    u = batch_size // micro_batches
    traced = trace_model(
        lm.model,
        lm.make_inputs(u),
        micro_batch_size=u,
        tracer=tracer,
        leaf_modules=leaf_modules,
        source=lm.spec.path,
    )
    n = stages * virtual
    blocks = traced.blocks
    bounds = [round(i * len(blocks) / n) for i in range(n + 1)]
    plans = []
    for j in range(n):
        mine = blocks[bounds[j] : bounds[j + 1]]
        plans.append(
            StagePlan(
                index=j, rank=j % stages, blocks=tuple(b.name for b in mine), block_indices=tuple(b.index for b in mine),
                nodes=tuple(x for b in mine for x in b.nodes), params=0, forward_s=1e-3, backward_s=2e-3,
                backward_input_s=1e-3, backward_weight_s=1e-3, recompute=j in recompute, memory_bytes=0.0,
                static_bytes=0.0, activation_bytes=0.0, held_bytes=0.0, send_bytes=0.0,
            )
        )  # fmt: skip
    return Plan(
        model=model_file, model_file=model_file, factory="build_model",
        model_kwargs=tuple(f"{k}={v!r}" for k, v in kwargs.items()), tracer=traced.tracer,
        leaf_modules=tuple(leaf_modules), max_blocks=None, fingerprint=traced.fingerprint(), profile_device="cpu",
        devices=stages, virtual=virtual, schedule=schedule, micro_batches=micro_batches, micro_batch_size=u,
        batch_size=batch_size, memory_limit_bytes=1e9, link_bandwidth=1e9, link_latency_s=0.0,
        recompute_policy="never", stages=tuple(plans), iteration_time_s=1e-2, bubble_fraction=0.2,
        throughput=1.0, peak_memory_bytes=(1e6,) * stages, alternatives=(), baselines=(),
    )  # fmt: skip


def reference_training(
    model_file: str, kwargs: Mapping[str, object], *, steps: int, batch_size: int, lr: float,
    optimizer: str = "SGD", seed: int = 0,
) -> tuple[list[float], dict[str, torch.Tensor]]:  # fmt: skip
    """Losses and final state_dict of plain single-process training of the unsplit model."""
    torch.manual_seed(seed)
    lm = load_model(model_file, dict(kwargs))
    model = lm.model
    model.train()
    opt = getattr(torch.optim, optimizer)(list(model.parameters()), lr=lr)
    losses = []
    for k in range(steps):
        torch.manual_seed(seed + k + 1)
        x = lm.make_inputs(batch_size)
        y = lm.make_targets(batch_size) if lm.make_targets is not None else None
        loss = lm.loss_fn(call_model(model, x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Largest absolute difference over the keys of ``b`` (all must be in ``a``)."""
    missing = sorted(set(b) - set(a))
    if missing:
        raise AssertionError(f"missing from the pipeline's state: {missing[:5]}")
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in b if b[k].numel())
