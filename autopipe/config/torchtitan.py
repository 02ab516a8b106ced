"""A plan as a torchtitan job: the numbers and notes all torchtitan outputs share, and the 0.2.x TOML.

:func:`titan_job` says the plan in torchtitan's numbers for one version (0.3.0 and main, whose
Python recipes :mod:`autopipe.config.titan_recipe` writes, or 0.2.x); :func:`torchtitan_toml`
writes the TOML of the last TOML releases, 0.2.x (the fields of ``torchtitan/config/job_config.py``
in v0.2.1 and v0.2.2, read by their ``ConfigManager``).

All say the same plan: the degrees (replicas as ``data_parallel_replicate_degree`` where
torchtitan replicates beside other parallelism, as 0.3.0 and main do; FSDP shards where it does
not, as 0.2.x), ``pipeline_parallel_schedule`` as ``torch.distributed.pipelining.get_schedule_class``
spells it (``1F1B``, ``Interleaved1F1B``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``,
``DualPipeV``), the micro-batches and ``module_fqns_per_model_part``: each stage's modules by
the user's names, in stage order (torchtitan places parts on ranks itself: round robin, or a V
for ``ZBVZeroBubble`` and ``DualPipeV``). A schedule torch has no class for (V-Half, V-Min,
ZB-H2, ...) runs from the CSV ``autopipe emit PLAN --schedule-csv FILE`` writes
(``pipeline_parallel_schedule_csv``: torchtitan then builds torch's ``_PipelineScheduleRuntime``
and loads the file with ``_load_csv``), with ``pipeline_parallel_schedule`` only placing the stages
(``ZBVZeroBubble`` for a V). The batch per data-parallel rank is one micro-batch when there is
no pipeline (torchtitan runs the rest as gradient accumulation) and the whole batch when there
is (torchtitan splits it into micro-batches). The precision is the plan's. What torchtitan
cannot express as the plan says is a ``#`` comment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autopipe._io import one_line
from autopipe.config.parallel_args import titan_parallel_lines
from autopipe.config.parts import Degrees, Parts, degrees, model_parts, plan_precision, stage_list
from autopipe.config.retarget import retarget_notes
from autopipe.plans import Plan
from autopipe.schedules.registry import schedule_spec

__all__ = [
    "TORCHTITAN_TOML_VERSION",
    "TORCHTITAN_VERSION",
    "TORCH_SCHEDULES",
    "schedule_csv_path",
    "titan_head",
    "titan_job",
    "torchtitan_parts",
    "torchtitan_schedule",
    "torchtitan_toml",
]

TORCHTITAN_VERSION = "0.3.0"
TORCHTITAN_TOML_VERSION = "0.2.x"
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
    """The torchtitan (torch ``get_schedule_class``) name of autopipe schedule ``name``; ``""`` if torch has none."""
    return schedule_spec(name).torch_class.removeprefix("Schedule")


@dataclass(frozen=True)
class _Job:
    """The plan in torchtitan's numbers, for either version."""

    deg: Degrees
    version: str  # TORCHTITAN_VERSION, "main" or TORCHTITAN_TOML_VERSION
    replicate: int
    shard: int
    reshard: str  # fsdp_reshard_after_forward: "default", "always" or "never"
    local_batch: int
    global_batch: int
    schedule: str  # pipeline_parallel_schedule: the schedule class, or only the placement when csv
    csv_path: str  # where the schedule CSV goes (written by autopipe emit PLAN --schedule-csv)
    csv: bool  # the plan's exact order from pipeline_parallel_schedule_csv (torch has no class for it)
    parts: list[list[str]]  # module names per model part
    recompute: str  # "none", "full" or "selective"
    precision: str  # "bfloat16" or "float32"
    notes: list[str]


def _fqns(plan: Plan, parts: Parts) -> tuple[list[list[str]], list[str]]:
    """Each stage's module names; a merged block (``blocks.3..blocks.5``) is expanded to the layers
    it covers where both ends are items of the layer list, and said in a note where not."""
    out: list[list[str]] = []
    odd: list[str] = []
    prefix = parts.container + "."
    for stage in plan.stages:
        names: list[str] = []
        for block in stage.blocks:
            ends = block.split("..")
            if len(ends) == 1:
                names.append(block)
            elif all(e.startswith(prefix) and e[len(prefix) :].isdigit() for e in ends):
                lo, hi = (int(e[len(prefix) :]) for e in (ends[0], ends[-1]))
                names += [f"{prefix}{j}" for j in range(lo, hi + 1)]
            else:
                names.append(block)
                odd.append(f"{block} (stage {stage.index})")
        out.append(names)
    notes = []
    if odd:
        notes.append(
            f"the block(s) {', '.join(odd)} merge several modules, which pipeline_module_split cannot place "
            "by one name: put the module names each covers in its place, or plan with finer blocks"
        )
    nested = [n for part in out for n in part if ".." not in n and (n.count(".") > 1 or _not_item(n))]
    if nested:
        shown = ", ".join(nested[:4]) + (", ..." if len(nested) > 4 else "")
        notes.append(
            f"torchtitan splits by top-level modules and items of a top-level module list ('layers.3'); "
            f"it cannot place {shown} (nested module names); rename the model's modules or split it by hand"
        )
    return out, notes


def torchtitan_parts(plan: Plan) -> list[list[str]]:
    """The module names of each part, as ``module_fqns_per_model_part`` lists them."""
    return _fqns(plan, model_parts(plan))[0]


def _not_item(name: str) -> bool:
    return "." in name and not name.split(".")[1].isdigit()


def _data_parallel(deg: Degrees, version: str) -> tuple[int, int, str, list[str]]:
    """(replicate degree, shard degree, fsdp_reshard_after_forward, notes). torchtitan shards with
    FSDP2 wherever ``data_parallel_shard_degree`` > 1 (weights, gradients and optimizer state: ZeRO-3)
    and replicates (DDP, or fully_shard's replicate dimension in 0.3.0 beside any parallelism; 0.2.x
    runs DDP only alone) the rest. So autopipe's zero3 is FSDP re-gathering per micro-batch
    (``always``), zero3-step FSDP gathering once a step (``never``; torch's pipeline stages keep the
    weights and gradients whole until the last backward), a hybrid group the shard degree with the
    copies replicated (HSDP), and ZeRO-1 and -2, which torchtitan does not have, FSDP too."""
    D, g = deg.data, deg.shard_group or deg.data
    if D == 1:
        return 1, 1, "default", []
    if deg.sharding in ("zero3", "zero3-step"):
        notes = []
        if deg.sharding == "zero3" and deg.pipeline > 1:
            notes.append(
                "zero3 with a pipeline: torch's pipeline stages reduce the gradients once a step and keep them whole "
                "until then, more memory than the plan priced (it reduces them each micro-batch)"
            )
        return D // g, g, "always" if deg.sharding == "zero3" else "never", notes
    if deg.sharding != "none":
        return (
            D // g,
            g,
            "never" if deg.pipeline > 1 else "default",
            [
                f"the plan's {'ZeRO-1' if deg.sharding == 'zero1' else 'ZeRO-2'} over {g} replicas is FSDP here "
                "(data_parallel_shard_degree): "
                "torchtitan has no ZeRO-1 or -2; the weights are sharded too, with more communication than planned"
            ],
        )
    if version != TORCHTITAN_TOML_VERSION or (deg.pipeline == 1 and deg.tensor == 1):
        return D, 1, "default", []
    return (
        1,
        D,
        "default",
        [
            f"torchtitan {version} runs DDP only without other parallelism, so the plan's {D} replicas "
            "are FSDP shards (data_parallel_shard_degree): less memory, more communication than planned"
        ],
    )


def _recompute(plan: Plan, deg: Degrees) -> tuple[str, list[str]]:
    chosen = [s.index for s in plan.stages if s.recompute]
    if plan.memory_choice:  # torchtitan's modes are none, full, its per-op selective policy and a compiled budget
        form = (
            "activation offload"
            if plan.offload_modules
            else "recomputation of some layers of a stage"
            if plan.recompute_layers
            else "recomputation by module kind"
        )
        return "full", [
            f"torchtitan has no {form} (the plan's {plan.memory_choice} in every layer): full, each layer "
            "recomputed whole instead, less memory and more time than the plan priced"
        ]
    if not chosen:
        if deg.selective_recompute:
            return "selective", [
                "selective: torchtitan's per-op policy, not Megatron's attention-only recomputation the plan priced"
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


def _titan_ranks(schedule: str, devices: int, stages: int) -> list[int]:
    """The rank torchtitan builds each stage on (``_get_pp_rank_to_stage_indices_mapping``):
    a V for ZBVZeroBubble and DualPipeV (rank r: stages r and 2S-1-r), round robin otherwise."""
    if schedule in _V_STYLE:
        return [j if j < devices else 2 * devices - 1 - j for j in range(stages)]
    return [j % devices for j in range(stages)]


def _csv_refusal(plan: Plan) -> str:
    """Why ``autopipe emit --schedule-csv`` refuses the plan (:func:`autopipe.stages.schedule_csv.schedule_csv`'s
    two refusals); "" when it writes the CSV."""
    recomputed = [s.index for s in plan.stages if s.recompute]
    if recomputed:
        return f"stage(s) {stage_list(recomputed)} recompute, and torch's schedule CSV has no recomputation action"
    placed = schedule_spec(plan.schedule).devices_of(plan.devices, plan.virtual)
    if [s.rank for s in plan.stages] != list(placed[: len(plan.stages)]):
        return f"the plan puts stages on other devices than its {plan.schedule} schedule does"
    return ""


def _schedule(plan: Plan, parts: Parts, csv_path: str, plan_file: str) -> tuple[str, bool, list[str]]:
    """(pipeline_parallel_schedule, whether the CSV runs, notes). A schedule torch has a class
    for runs by that class; one it lacks runs from autopipe's schedule CSV (torchtitan's
    ``_PipelineScheduleRuntime``), with pipeline_parallel_schedule only placing the stages."""
    schedule, notes, csv = torchtitan_schedule(plan.schedule), [], False
    if schedule not in TORCH_SCHEDULES:
        placement = "ZBVZeroBubble" if not parts.round_robin else "Interleaved1F1B" if plan.virtual > 1 else "1F1B"
        if plan.devices == 1:  # no pipeline: torchtitan builds no schedule
            return placement, False, []
        refusal = _csv_refusal(plan)
        if not refusal and [s.rank for s in plan.stages] != _titan_ranks(placement, plan.devices, len(plan.stages)):
            refusal = "torchtitan places stages round robin or in a V only, and the CSV's ranks must be its"
        if not refusal:
            csv = True
            where = "in a V" if placement in _V_STYLE else "round robin"
            notes += [
                f"torch has no {plan.schedule} schedule class: torchtitan runs the plan's exact order from "
                f"pipeline_parallel_schedule_csv ({csv_path}); pipeline_parallel_schedule = {placement} "
                f"only places the stages ({where})",
                f"write the CSV first: autopipe emit {plan_file} --schedule-csv {csv_path}",
            ]
        else:
            named = f" (torch calls it {schedule})" if schedule else ""
            notes.append(
                f"torch has no {plan.schedule} schedule class{named} and autopipe writes no schedule CSV for this "
                f"plan ({refusal}): torchtitan runs {placement} with these stages"
            )
        schedule = placement
    titan = _titan_ranks(schedule, plan.devices, len(plan.stages))
    if plan.devices > 1 and [s.rank for s in plan.stages] != titan:
        where = "in a V" if schedule in _V_STYLE else "round robin"
        notes.append(f"torchtitan places the {schedule} stages {where}, not as the plan's {plan.schedule} does")
    return schedule, csv, notes


def _precision(plan: Plan) -> tuple[str, list[str]]:
    priced = plan_precision(plan)
    if priced == "fp8":
        return "bfloat16", [
            "the plan is priced in fp8 (linear layers in float8, the rest in bf16): torchtitan does that with "
            'torchao\'s Float8 linear converter: 0.2.x TOML [model] converters = ["quantize.linear.float8"], '
            "0.3.0 / main model_registry(..., converters=[Float8LinearConverter.Config()]) in the recipe"
        ]
    if priced == "fp16":
        return "bfloat16", ["the plan is priced in fp16; torchtitan trains in bfloat16 or float32: bfloat16 here"]
    return ("bfloat16" if priced == "bf16" else "float32"), []


Overrides = tuple[int | None, bool | None, bool | None, bool | None]
"""tensor_parallel, sequence_parallel, selective_recompute, zero1: as :func:`autopipe.config.parts.degrees`."""


def titan_job(plan: Plan, version: str, overrides: Overrides, csv_path: str = "", plan_file: str = "plan.json") -> _Job:
    """The plan in torchtitan ``version``'s numbers and notes; ``csv_path`` is where the plan's
    schedule CSV goes (default: beside ``plan_file``, ``plan.schedule.csv``)."""
    deg = degrees(plan, *overrides)
    parts = model_parts(plan)
    replicate, shard, reshard, dp_notes = _data_parallel(deg, version)
    fqns, fqn_notes = _fqns(plan, parts)
    csv_path = csv_path or schedule_csv_path(plan_file)
    schedule, csv, schedule_notes = _schedule(plan, parts, csv_path, plan_file)
    mode, recompute_notes = _recompute(plan, deg)
    precision, precision_notes = _precision(plan)
    notes = [n for n in parts.notes if n not in parts.layer_only] + dp_notes + fqn_notes + schedule_notes
    if deg.tensor > 1 and plan.overlap.tp_comm > 0:
        notes.append(
            f"the plan hid {plan.overlap.tp_comm:.0%} of the tensor-parallel collectives: torchtitan overlaps them "
            "with compile.enable_async_tensor_parallel (with compile.enable and the model compiled)"
        )
    if deg.tensor > 1 and not deg.sequence_parallel and version == TORCHTITAN_TOML_VERSION:
        notes.append("torchtitan 0.2.x's tensor parallelism always shards the sequence too (sequence parallel)")
    pipelined = deg.pipeline > 1
    return _Job(
        deg=deg,
        version=version,
        replicate=replicate,
        shard=shard,
        reshard=reshard,
        local_batch=plan.batch_size if pipelined else plan.micro_batch_size,
        global_batch=plan.batch_size * deg.data,
        schedule=schedule,
        csv_path=csv_path,
        csv=csv,
        parts=fqns,
        recompute=mode,
        precision=precision,
        notes=notes + recompute_notes + precision_notes + retarget_notes(plan, "torchtitan"),
    )


def schedule_csv_path(plan_file: str) -> str:
    """Where the torchtitan outputs say the plan's schedule CSV is: ``runs/plan.json`` ->
    ``runs/plan.schedule.csv``."""
    path = Path(plan_file)
    return str(path.with_name(path.stem + ".schedule.csv"))


def titan_head(plan: Plan, job: _Job, what: str) -> list[str]:
    """The ``#`` lines every torchtitan output starts with: what it is, the plan, the notes."""
    deg = job.deg
    lines = [
        f"# {what} for {one_line(plan.model)}",  # a newline in it would start a TOML table
        f"# autopipe plan: {plan.schedule}, "
        f"{deg.sizes}, "
        f"{plan.micro_batches} micro-batch(es) of {plan.micro_batch_size}",
    ]
    if deg.pipeline == 1 and plan.micro_batches > 1:
        counted = (
            "num_tokens_per_train_step / num_tokens_per_microbatch_per_dp_rank / replicas"
            if job.version == "main"
            else "global_batch_size / local_batch_size / replicas"
        )
        lines.append(
            f"# no pipeline: each data-parallel rank runs {plan.micro_batches} micro-batches of "
            f"{plan.micro_batch_size} as gradient accumulation ({counted})"
        )
    return lines + [f"# {one_line(n)}" for n in job.notes]  # a note quoting the plan stays one comment


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
    plan_file: str = "plan.json",
    csv_path: str = "",
) -> str:
    """The plan as a torchtitan 0.2.x TOML job config, with ``#`` notes; ``plan_file`` and
    ``csv_path`` as :func:`titan_job`."""
    overrides = (tensor_parallel, sequence_parallel, selective_recompute, zero1)
    job = titan_job(plan, TORCHTITAN_TOML_VERSION, overrides, csv_path, plan_file)
    deg = job.deg
    training = [f"mixed_precision_param = {json.dumps(job.precision)}"]
    notes = []
    if job.precision == "bfloat16" and job.shard == 1 and (deg.pipeline > 1 or deg.tensor > 1):
        training.append('dtype = "bfloat16"')
        notes.append(
            "torchtitan 0.2.x applies mixed precision only with FSDP (or alone with DDP), so with pipeline or "
            'tensor parallelism and no shards it trains in fp32: dtype = "bfloat16" trains in bf16 throughout '
            "(weights, gradients and optimizer state too: less memory than the plan's fp32 master weights)"
        )
    parallel, parallel_notes = titan_parallel_lines(deg, job.shard)  # none at cp = ep = 1
    notes += parallel_notes
    title = f"torchtitan {TORCHTITAN_TOML_VERSION} job config (the fields of torchtitan/config/job_config.py, v0.2.1-2)"
    head = titan_head(plan, job, title)
    lines = [
        *head,
        "# [model] name/flavor and training.seq_len are the model's own: set them to the torchtitan model that is "
        "yours (the module names below are your model's)",
        *[f"# {one_line(n)}" for n in notes],
        "",
        "[training]",
        f"local_batch_size = {job.local_batch}",
        f"global_batch_size = {job.global_batch}",
        *training,
        "",
        "[parallelism]",
        f"data_parallel_replicate_degree = {job.replicate}",
        f"data_parallel_shard_degree = {job.shard}",
        *([f"fsdp_reshard_after_forward = {json.dumps(job.reshard)}"] if job.reshard != "default" else []),
        f"tensor_parallel_degree = {deg.tensor}",
        f"pipeline_parallel_degree = {deg.pipeline}",
        f"pipeline_parallel_schedule = {json.dumps(job.schedule)}",
        *([f"pipeline_parallel_schedule_csv = {json.dumps(job.csv_path)}"] if job.csv else []),
        f"pipeline_parallel_microbatch_size = {plan.micro_batch_size}",
        f"module_fqns_per_model_part = {_toml_list(job.parts)}",
        *parallel,
    ]
    if job.schedule == "DualPipeV" and not plan.overlap.expert_comm:  # its expert-overlap callback needs CUDA and
        lines.append("pipeline_parallel_expert_parallel_overlap = false")  # an MoE: on where the plan priced it
    if plan_precision(plan) == "fp8":
        lines += ["", "[model]", 'converters = ["quantize.linear.float8"]']
    lines += ["", "[activation_checkpoint]", f"mode = {json.dumps(job.recompute)}"]
    if job.recompute == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"
