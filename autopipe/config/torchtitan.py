"""A plan as a torchtitan job config (``autopipe config PLAN --for torchtitan``).

The TOML is in the format of torchtitan's last TOML release line, 0.2.x: the fields of
``torchtitan/config/job_config.py`` in v0.2.1 (its own ``ConfigManager`` reads these files).
``[parallelism]`` gets the degrees, ``pipeline_parallel_schedule`` as ``torch.distributed.pipelining.get_schedule_class`` spells it
(the schedule's torch class without ``Schedule``: ``1F1B``, ``Interleaved1F1B``,
``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``), the micro-batch size and
``module_fqns_per_model_part``: each stage's blocks, the user's module names, in stage order
(torchtitan places parts on ranks itself: round robin, or a V for ``ZBVZeroBubble`` and
``DualPipeV``). ``[training]`` gets the batch per data-parallel rank and the global batch,
``[activation_checkpoint]`` the mode (``none``, ``full``, ``selective``). What torchtitan cannot
express as the plan says is a ``#`` comment.
"""

from __future__ import annotations

import json

from autopipe.config.parts import Degrees, Parts, degrees, model_parts, stage_list
from autopipe.plans import Plan
from autopipe.schedules.registry import schedule_spec

__all__ = ["TORCHTITAN_VERSION", "TORCH_SCHEDULES", "torchtitan_schedule", "torchtitan_toml"]

TORCHTITAN_VERSION = "0.2.x"
TORCH_SCHEDULES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
"""The names ``torch.distributed.pipelining.schedules.get_schedule_class`` takes (torch 2.13)."""
_V_STYLE = ("ZBVZeroBubble", "DualPipeV")  # the schedules torchtitan places in a V (the rest: round robin)


def torchtitan_schedule(name: str) -> str:
    """The torchtitan (torch ``get_schedule_class``) name of autopipe schedule ``name``."""
    return schedule_spec(name).torch_class.removeprefix("Schedule")


def _fqn_note(parts: Parts, plan: Plan) -> list[str]:
    """torchtitan keeps a stage's modules by name: top-level modules, or items of a top-level
    ModuleList/ModuleDict (``layers.3``); other names it cannot place."""
    odd = [b for s in plan.stages for b in s.blocks if b.count(".") > 1 or ("." in b and not b.split(".")[1].isdigit())]
    if not odd:
        return []
    shown = ", ".join(odd[:4]) + (", ..." if len(odd) > 4 else "")
    return [
        f"torchtitan splits by top-level modules and items of a top-level module list ('layers.3'); "
        f"it cannot place {shown} (nested module names); rename the model's modules or split it by hand"
    ]


def _data_parallel(deg: Degrees) -> tuple[int, int, list[str]]:
    """(replicate degree, shard degree, notes): autopipe prices D replicas with a gradient
    all-reduce (DDP); torchtitan 0.2 runs DDP only when it is the only parallelism."""
    if deg.pipeline == 1 and deg.tensor == 1 and not deg.zero1:
        return deg.data, 1, []
    if deg.data == 1:
        return 1, 1, []
    if deg.zero1:
        return (
            1,
            deg.data,
            [
                f"the plan's ZeRO-1 over {deg.data} replicas is FSDP here (data_parallel_shard_degree): "
                "parameters and gradients are sharded too, with more communication than planned"
            ],
        )
    return (
        1,
        deg.data,
        [
            f"torchtitan runs DDP only without other parallelism, so the plan's {deg.data} replicas "
            "are FSDP shards (data_parallel_shard_degree): less memory, more communication than planned"
        ],
    )


def _recompute(plan: Plan, deg: Degrees) -> tuple[str, list[str]]:
    chosen = [s.index for s in plan.stages if s.recompute]
    if not chosen:
        if deg.selective_recompute:
            return "selective", [
                'selective: torchtitan\'s per-op policy (selective_ac_option = "op"), '
                "not Megatron's attention-only recomputation the plan priced"
            ]
        return "none", []
    notes = ["full: torchtitan checkpoints each transformer layer (the plan prices each stage as one piece)"]
    if len(chosen) < len(plan.stages):
        rest = [s.index for s in plan.stages if not s.recompute]
        notes.append(
            f"the plan recomputes stage(s) {stage_list(chosen)} only; torchtitan's mode is one "
            f"for all stages, so stage(s) {stage_list(rest)} recompute too"
        )
    return "full", notes


def _toml_list(parts: list[list[str]]) -> str:
    rows = ",\n".join("  [" + ", ".join(json.dumps(name) for name in part) + "]" for part in parts)
    return "[\n" + rows + ",\n]"


def torchtitan_toml(
    plan: Plan,
    *,
    tensor_parallel: int | None = None,
    sequence_parallel: bool | None = None,
    selective_recompute: bool | None = None,
    zero1: bool | None = None,
) -> str:
    """The plan as a torchtitan TOML job config, with ``#`` notes."""
    deg = degrees(plan, tensor_parallel, sequence_parallel, selective_recompute, zero1)
    parts = model_parts(plan)
    schedule = torchtitan_schedule(plan.schedule)
    replicate, shard, notes = _data_parallel(deg)
    notes = list(parts.notes) + notes + _fqn_note(parts, plan)
    if schedule not in TORCH_SCHEDULES:
        fallback = "ZBVZeroBubble" if not parts.round_robin else "Interleaved1F1B" if plan.virtual > 1 else "1F1B"
        notes.append(
            f"torch has no {plan.schedule} schedule ({schedule}); torchtitan runs {fallback} with these stages instead"
        )
        schedule = fallback
    if (schedule in _V_STYLE) != (not parts.round_robin):
        where = "in a V" if schedule in _V_STYLE else "round robin"
        notes.append(f"torchtitan places the {schedule} stages {where}, not as the plan's {plan.schedule} does")
    if deg.tensor > 1 and not deg.sequence_parallel:
        notes.append("torchtitan's tensor parallelism always shards the sequence too (sequence parallel)")
    mode, recompute_notes = _recompute(plan, deg)
    notes += recompute_notes
    lines = [
        f"# torchtitan {TORCHTITAN_VERSION} job config (the fields of torchtitan/config/job_config.py, v0.2.1) for {plan.model}",
        f"# autopipe plan: {plan.schedule}, t x p x d = {deg.tensor} x {deg.pipeline} x {deg.data} = {deg.world_size} GPUs, "
        f"{plan.micro_batches} micro-batch(es) of {plan.micro_batch_size}",
        "# [model] name/flavor and training.seq_len are the model's own: set them to the torchtitan model that is "
        "yours (the module names below are your model's)",
        *[f"# {n}" for n in notes],
        "",
        "[training]",
        f"local_batch_size = {plan.batch_size}",
        f"global_batch_size = {plan.batch_size * deg.data}",
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f"tensor_parallel_degree = {deg.tensor}",
        f"pipeline_parallel_degree = {deg.pipeline}",
        f"pipeline_parallel_schedule = {json.dumps(schedule)}",
        f"pipeline_parallel_microbatch_size = {plan.micro_batch_size}",
        f"module_fqns_per_model_part = {_toml_list([list(s.blocks) for s in plan.stages])}",
        "",
        "[activation_checkpoint]",
        f"mode = {json.dumps(mode)}",
    ]
    if mode == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"
