"""How the CLI shows a Plan: stage table, prediction, baselines, a text timeline, JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autopipe.plans import FreePlan, Plan
from autopipe.schedules.targets import target_spec
from autopipe.show.picture import placement_shape, placement_words
from autopipe.units import format_bytes, format_count

__all__ = ["plan_json", "print_plan"]


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


def _devices(plan: Plan) -> list[str]:
    """The device column: each stage's device, with ``↓``/``↑`` for the leg of a V (down the
    devices, back up) where the stages lie in a V or a zigzag."""
    ranks = [s.rank for s in plan.stages]
    if placement_shape(ranks, plan.devices) not in ("V", "zigzag"):
        return [str(r) for r in ranks]
    return [f"{r} {'↑' if (j // plan.devices) % 2 else '↓'}" for j, r in enumerate(ranks)]


def stage_table(plan: Plan) -> Table:
    t = Table(title=f"{plan.model}: plan", title_justify="left")
    for col in ("stage", "device", "layers", "blocks", "params", "F ms", "B ms", "memory / limit", "recompute"):
        t.add_column(col, justify="right" if col not in ("layers", "recompute") else "left")
    for s, device in zip(plan.stages, _devices(plan), strict=True):
        span = s.blocks[0] if len(s.blocks) == 1 else f"{s.blocks[0]} .. {s.blocks[-1]}"
        t.add_row(
            str(s.index),
            device,
            span,
            str(len(s.blocks)),
            format_count(s.params),
            _ms(s.forward_s),
            _ms(s.backward_s),
            f"{format_bytes(s.memory_bytes)} / {format_bytes(plan.memory_limit_bytes / plan.virtual)}",
            "yes" if s.recompute else "",
        )
    return t


def baseline_table(plan: Plan) -> Table:
    t = Table(title=f"same schedule ({plan.schedule}, m={plan.micro_batches}) with simple splits", title_justify="left")
    mine = any(b.name.startswith("autopipe") for b in plan.baselines)  # a --balance plan: autopipe's best is a baseline
    for col in (
        "split",
        "blocks per stage",
        "iteration ms",
        "vs yours" if mine else "vs autopipe",
        "bubble",
        "peak memory",
        "fits",
    ):
        t.add_column(col, justify="left" if col in ("split", "blocks per stage") else "right")
    t.add_row(
        "your split" if mine else "autopipe",
        "/".join(str(len(s.blocks)) for s in plan.stages),
        _ms(plan.iteration_time_s),
        "1.00x",
        f"{plan.bubble_fraction:.1%}",
        format_bytes(max(plan.peak_memory_bytes)),
        "yes",
    )
    for b in plan.baselines:
        ratio = b.iteration_time_s / plan.iteration_time_s if plan.iteration_time_s else float("nan")
        t.add_row(
            b.name,
            "/".join(map(str, b.stage_blocks)),
            _ms(b.iteration_time_s),
            f"{ratio:.2f}x",
            f"{b.bubble_fraction:.1%}",
            format_bytes(max(b.peak_memory_bytes)),
            "yes" if b.fits else Text("no (OOM)", style="red"),
        )
    return t


def print_plan(plan: Plan, console: Console, timeline_rows: list[str] | None = None, wrote: str | None = None) -> None:
    console.print(stage_table(plan))
    placed = placement_words([s.rank for s in plan.stages], plan.devices)
    if placed:
        console.print(placed, highlight=False)
    console.print(
        f"schedule [bold]{escape(plan.schedule)}[/]"
        + (f" (v={plan.virtual})" if plan.virtual > 1 else "")
        + f", {plan.micro_batches} micro-batch{'es' if plan.micro_batches != 1 else ''} of {plan.micro_batch_size} "
        f"(batch {plan.batch_size}); "
        f"predicted iteration [bold]{_ms(plan.iteration_time_s)} ms[/]"
        + (f" ± {plan.uncertainty:.0%}" if plan.uncertainty > 0 else "")
        + f", bubble {plan.bubble_fraction:.1%}, "
        f"{plan.throughput:.1f} samples/s",
        markup=True,  # autopipe's own styles; the one string from the plan is escaped
    )
    if plan.memory_choice:
        console.print(f"activations: {memory_words(plan)}", highlight=False, markup=False)
    if plan.noise_note:
        console.print(f"note: {plan.noise_note}", highlight=False, markup=False)
    if plan.host_sharing != 1.0:
        console.print(
            f"{plan.devices} ranks sharing this host: compute priced x{plan.host_sharing:.2f} "
            "(the contention measured beside the profile)",
            highlight=False,
        )
    if plan.data_parallel > 1 or plan.tensor_parallel > 1:
        console.print(layout_line(plan))
        console.print(data_parallel_line(plan), highlight=False)
    for line in target_lines(plan):
        console.print(line, highlight=False)
    if plan.alternatives:
        alt = ", ".join(
            f"{a.schedule}{f'/v{a.virtual}' if a.virtual > 1 else ''} m={a.micro_batches}"
            f"{f' ({a.memory})' if a.memory else ''}: {_ms(a.iteration_time_s)} ms"
            for a in plan.alternatives[:3]
        )
        console.print(f"runners-up: {alt}")
    console.print(baseline_table(plan))
    if timeline_rows:
        for row in timeline_rows:
            console.print(row, highlight=False, markup=True)  # draw.text_timeline's markup: no plan strings
    if wrote:
        console.print(wrote)


def target_lines(plan: Plan) -> list[str]:
    """The framework the plan was made for (none for autopipe's own) and, where its search keeps to
    less than autopipe's, both predictions: the free plan's and this one's."""
    if plan.target == "autopipe":
        return []
    from autopipe.api import target_note

    from .args import cli_words

    spec = target_spec(plan.target)
    lines = [f"target {plan.target} ({spec.label}): searched {spec.searched()}"]
    note = target_note(plan, cli_words())
    return lines + ([note] if note else [])


def memory_words(plan: Plan) -> str:
    """The plan's uniform memory choice for people: ``recompute core_attn+mlp in every layer
    (selective recomputation)``, ``recompute the first 2 layers of each stage whole``, ``offload
    qkv_linear in every layer (its saved inputs to the host and back)``."""
    if plan.recompute_modules:
        return f"{plan.memory_choice} in every layer (selective recomputation)"
    if plan.recompute_layers:
        k = plan.recompute_layers
        return f"recompute the first {k} layer{'s' if k != 1 else ''} of each stage whole"
    return f"{plan.memory_choice} in every layer (its saved inputs to the host and back)"


def layout_line(plan: Plan) -> str:
    """The parallel layout in Megatron-LM's words: t, p, d, vpp, micro-batch size, recompute."""
    recomputed = sum(s.recompute for s in plan.stages)
    recompute = "none" if not recomputed else f"full on {recomputed}/{len(plan.stages)} stages"
    if plan.recompute_modules:
        recompute = f"selective ({' '.join(plan.recompute_modules)})"
    elif plan.recompute_layers:
        recompute = f"block, {plan.recompute_layers} layer{'s' if plan.recompute_layers != 1 else ''} per stage"
    elif plan.offload_modules:
        recompute += f", offload ({' '.join(plan.offload_modules)})"
    tflops = tflops_per_gpu(plan)
    cp = f"cp={plan.context_parallel} (context), " if plan.context_parallel > 1 else ""
    ep = ""
    if plan.expert_parallel * plan.expert_tensor_parallel > 1:
        hidden = ", all-to-all hidden" if plan.overlap.expert_comm else ""
        ep = f"ep={plan.expert_parallel} x etp={plan.expert_tensor_parallel} (experts{hidden}), "
    return (
        f"layout: t={plan.tensor_parallel} (tensor{', sequence parallel' if plan.sequence_parallel else ''}), "
        f"{cp}p={plan.devices} (pipeline), d={plan.data_parallel} (data), {ep}vpp={plan.virtual}, micro-batch size "
        f"{plan.micro_batch_size}, recompute {recompute}"
        + (f"; {tflops[0]:.0f} model TFLOP/s per GPU ({tflops[1]:.0f} with recomputation)" if plan.model_flops else "")
    )


def data_parallel_line(plan: Plan) -> str:
    """The sharding and what the time model overlapped: ``data parallel: zero1 over 8 replicas;
    collectives 0.412 s a step, 0.051 s past the pipeline; overlapped: grad reduce, param gather, p2p``."""
    D = plan.data_parallel
    shards = f"over {plan.shard_group} of {D} replicas (hybrid)" if plan.shard_group else f"over {D} replicas"
    state = f"{plan.sharding} {shards}" if plan.sharding != "none" else f"none ({D} whole replicas)"
    comm = (
        f"; collectives {_seconds(plan.dp_comm_s)} a step, {_seconds(plan.allreduce_s)} past the pipeline"
        if D > 1
        else ""
    )
    return f"data parallel: {state}{comm}; overlapped: {plan.overlap.describe()}"


def _seconds(s: float) -> str:
    return f"{s:.3f} s" if s >= 1.0 else f"{s * 1e3:.3f} ms"


def tflops_per_gpu(plan: Plan) -> tuple[float, float]:
    """(model, hardware) TFLOP/s per device: FLOPs of one iteration / step time / devices."""
    gpus = plan.tensor_parallel * plan.context_parallel * plan.devices * plan.data_parallel
    step = plan.step_time_s
    if step <= 0:
        return 0.0, 0.0
    return plan.model_flops / step / gpus / 1e12, plan.hardware_flops / step / gpus / 1e12


def plan_json(plan: Plan) -> dict[str, Any]:
    """The one JSON object ``autopipe plan --json`` prints for scripts."""
    return {
        "model": plan.model,
        "schedule": plan.schedule,
        "virtual": plan.virtual,
        "micro_batches": plan.micro_batches,
        "micro_batch_size": plan.micro_batch_size,
        "batch_size": plan.batch_size,
        "iteration_time_s": plan.iteration_time_s,
        "uncertainty": plan.uncertainty,
        "noise_note": plan.noise_note,
        "host_sharing": plan.host_sharing,
        "bubble_fraction": plan.bubble_fraction,
        "throughput": plan.throughput,
        "data_parallel": plan.data_parallel,
        "tensor_parallel": plan.tensor_parallel,
        "pipeline_parallel": plan.devices,
        "context_parallel": plan.context_parallel,
        "expert_parallel": plan.expert_parallel,
        "expert_tensor_parallel": plan.expert_tensor_parallel,
        "sequence_parallel": plan.sequence_parallel,
        "model_tflops_per_gpu": tflops_per_gpu(plan)[0],
        "hardware_tflops_per_gpu": tflops_per_gpu(plan)[1],
        "allreduce_s": plan.allreduce_s,
        "sharding": str(plan.sharding),
        "shard_group": plan.shard_group,
        "dp_comm_s": plan.dp_comm_s,
        "overlap": plan.overlap.text(),
        "step_time_s": plan.step_time_s,
        "memory_limit_bytes": plan.memory_limit_bytes,
        "peak_memory_bytes": list(plan.peak_memory_bytes),
        "recompute_modules": list(plan.recompute_modules),
        "recompute_layers": plan.recompute_layers,
        "offload_modules": list(plan.offload_modules),
        "stages": [
            {
                "index": s.index,
                "device": s.rank,
                "blocks": list(s.blocks),
                "time_s": s.forward_s + s.backward_s,
                "forward_s": s.forward_s,
                "backward_s": s.backward_s,
                "memory_bytes": s.memory_bytes,
                "recompute": s.recompute,
                "params": s.params,
            }
            for s in plan.stages
        ],
        "baselines": [
            {
                "name": b.name,
                "iteration_time_s": b.iteration_time_s,
                "bubble_fraction": b.bubble_fraction,
                "fits": b.fits,
                "stage_blocks": list(b.stage_blocks),
            }
            for b in plan.baselines
        ],
        "alternatives": [
            {
                "schedule": a.schedule,
                "virtual": a.virtual,
                "micro_batches": a.micro_batches,
                "iteration_time_s": a.iteration_time_s,
                "memory": a.memory,
            }
            for a in plan.alternatives
        ],
        "target": plan.target,
        "free_plan": _free_json(plan, plan.free_plan) if plan.free_plan is not None else None,
    }


def _free_json(plan: Plan, free: FreePlan) -> dict[str, Any]:
    """The free plan's prediction beside a targeted plan (``target_cost``: the targeted plan's
    step time over the free plan's, less one)."""
    return {
        "schedule": free.schedule,
        "virtual": free.virtual,
        "micro_batches": free.micro_batches,
        "recomputed_stages": list(free.recomputed),
        "memory": free.memory,
        "iteration_time_s": free.iteration_time_s,
        "step_time_s": free.step_time_s,
        "tensor_parallel": free.tensor_parallel,
        "pipeline_parallel": free.devices,
        "data_parallel": free.data_parallel,
        "target_cost": plan.step_time_s / free.step_time_s - 1 if free.step_time_s > 0 else 0.0,
    }
