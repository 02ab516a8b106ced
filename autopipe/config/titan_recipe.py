"""A plan as a torchtitan recipe module (Python): ``autopipe config PLAN --for torchtitan`` (0.3.0)
or ``--for torchtitan-main``.

Since the config refactor (torchtitan #2386) a job is a ``Trainer.Config`` returned by a function
of a recipe module, which a user passes as ``--module``/``--config``. :func:`torchtitan_recipe`
writes such a module for one of two forms of ``TrainingConfig`` and ``ParallelismConfig``
(``torchtitan/config/configs.py``), which differ only in how a batch is counted:

- ``0.3.0`` (the release on the package index): samples: ``training.local_batch_size`` (per
  data-parallel rank), ``training.global_batch_size``, ``parallelism.pipeline_parallel_microbatch_size``
  (torchtitan splits the local batch into micro-batches of that size);
- ``main`` (after #4121, "fold batch dim", 2026-08-20; checked at :data:`TORCHTITAN_MAIN_COMMIT`):
  tokens: ``training.num_tokens_per_microbatch_per_dp_rank`` (one micro-batch's tokens, one
  forward), ``training.num_tokens_per_train_step`` (all ranks, all micro-batches and gradient
  accumulation steps), ``training.max_context_length`` (was ``seq_len``) and the micro-batch
  *count* ``parallelism.num_pp_microbatches`` (ignored without a pipeline). A sample is one
  sequence of ``max_context_length`` tokens (the base recipe's: autopipe's plan has no sequence
  length), so the plan's micro-batch of ``b`` samples is ``b * max_context_length`` tokens.

The rest is shared, from :func:`autopipe.config.torchtitan.titan_job`: degrees, schedule (and
``pipeline_parallel_schedule_csv`` where torch has no class for the plan's schedule), module
names per part, ``activation_checkpoint`` (``None``, ``FullAC.Config()``, ``SelectiveAC.Config()``
of ``torchtitan/distributed/activation_checkpoint.py``) and precision.

torchtitan's own code reads them in tests/config/test_titan_own_code.py and test_titan_csv.py.

Tests: tests/config/test_torchtitan.py.
"""

from __future__ import annotations

import json

from autopipe.config.torchtitan import TORCHTITAN_VERSION, titan_head, titan_job
from autopipe.errors import ConfigError
from autopipe.plans import Plan

__all__ = ["TORCHTITAN_MAIN_COMMIT", "TORCHTITAN_MAIN_DATE", "torchtitan_recipe"]

TORCHTITAN_MAIN_COMMIT = "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a"
"""The torchtitan main commit whose config classes ``--for torchtitan-main`` was written against."""
TORCHTITAN_MAIN_DATE = "2026-08-21"
_BASE = "torchtitan.models.llama3.config_registry", "llama3_debugmodel"  # the recipe the job starts from
_VERSIONS = (TORCHTITAN_VERSION, "main")


def _batch_lines(plan: Plan, version: str, local_batch: int, dp: int) -> list[str]:
    """The lines that say the batch, in the version's units."""
    if version == TORCHTITAN_VERSION:
        return [
            f"    config.training.local_batch_size = {local_batch}",
            f"    config.training.global_batch_size = {plan.batch_size * dp}",
        ]
    samples = plan.batch_size * dp  # per step, all data-parallel ranks
    return [
        "    seq = config.training.max_context_length  # tokens per sample: the base recipe's sequence length",
        f"    config.training.num_tokens_per_microbatch_per_dp_rank = {plan.micro_batch_size} * seq",
        f"    config.training.num_tokens_per_train_step = {samples} * seq",
    ]


def _micro_lines(plan: Plan, version: str) -> list[str]:
    if version == TORCHTITAN_VERSION:
        return [f"    config.parallelism.pipeline_parallel_microbatch_size = {plan.micro_batch_size}"]
    return [f"    config.parallelism.num_pp_microbatches = {plan.micro_batches if plan.devices > 1 else 1}"]


def _py_list(parts: list[list[str]]) -> list[str]:
    rows = ["        [" + ", ".join(json.dumps(name) for name in part) + "]," for part in parts]
    return ["    config.parallelism.module_fqns_per_model_part = [", *rows, "    ]"]


def torchtitan_recipe(
    plan: Plan,
    *,
    tensor_parallel: int | None = None,
    sequence_parallel: bool | None = None,
    selective_recompute: bool | None = None,
    zero1: bool | None = None,
    module: str = "autopipe_recipe",
    version: str = TORCHTITAN_VERSION,
    plan_file: str = "plan.json",
    csv_path: str = "",
) -> str:
    """The plan as a torchtitan recipe module (``version`` ``"0.3.0"`` or ``"main"``), with ``#``
    notes; ``module`` is the name the file is saved under (``autopipe_recipe.py``), for the launch
    line it prints; ``plan_file`` and ``csv_path`` name the plan and its schedule CSV in the
    ``autopipe emit`` line (where the schedule runs from the CSV)."""
    if version not in _VERSIONS:
        raise ConfigError(f"torchtitan version {version!r} has no recipe form in autopipe; use one of {_VERSIONS}")
    overrides = (tensor_parallel, sequence_parallel, selective_recompute, zero1)
    job = titan_job(plan, version, overrides, csv_path, plan_file)
    deg = job.deg
    checked = f", commit {TORCHTITAN_MAIN_COMMIT[:12]} of {TORCHTITAN_MAIN_DATE}" if version == "main" else ""
    head = titan_head(plan, job, f"torchtitan {version} recipe (Trainer.Config{checked})")
    ac = {"none": "None", "full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}[job.recompute]
    imports = {"none": [], "full": ["FullAC"], "selective": ["SelectiveAC"]}[job.recompute]
    body = [
        "    config = base_config()",
        *_batch_lines(plan, version, job.local_batch, deg.data),
        f"    config.training.mixed_precision_param = {json.dumps(job.precision)}",
    ]
    if deg.pipeline > 1:
        body.append("    config.training.disable_cuda_graphs = True  # torchtitan's CUDA graphs do not take a pipeline")
    body += [
        f"    config.parallelism.data_parallel_replicate_degree = {job.replicate}",
        f"    config.parallelism.data_parallel_shard_degree = {job.shard}",
        *(
            [f"    config.parallelism.fsdp_reshard_after_forward = {json.dumps(job.reshard)}"]
            if job.reshard != "default"
            else []
        ),
        f"    config.parallelism.tensor_parallel_degree = {deg.tensor}",
        *([f"    config.parallelism.enable_sequence_parallel = {deg.sequence_parallel}"] if deg.tensor > 1 else []),
        f"    config.parallelism.pipeline_parallel_degree = {deg.pipeline}",
        f"    config.parallelism.pipeline_parallel_schedule = {json.dumps(job.schedule)}",
        *([f"    config.parallelism.pipeline_parallel_schedule_csv = {json.dumps(job.csv_path)}"] if job.csv else []),
        *_micro_lines(plan, version),
        *_py_list(job.parts),
        f"    config.activation_checkpoint = {ac}",
        "    return config",
    ]
    launch = f"torchrun --nproc-per-node {deg.world_size} -m torchtitan.train --module {module} --config autopipe_plan"
    top = [
        *head,
        f"# save as {module}.py where Python finds it (PYTHONPATH), then run:",
        f"#   {launch}",
        "# (several nodes: torchrun --nnodes N --nproc-per-node G with N x G = the GPUs above)",
        "# base_config is the recipe of the model you train (its model_spec, "
        + ("seq_len" if version == TORCHTITAN_VERSION else "max_context_length")
        + ", data, optimizer);",
        "# the module names below are your model's",
        "",
        *([f"from torchtitan.distributed.activation_checkpoint import {imports[0]}"] if imports else []),
        f"from {_BASE[0]} import {_BASE[1]} as base_config",
        "from torchtitan.trainer import Trainer",
        "",
        "",
        "def autopipe_plan() -> Trainer.Config:",
    ]
    return "\n".join(top + body) + "\n"
