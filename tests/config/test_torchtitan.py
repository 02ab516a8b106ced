"""autopipe/config/torchtitan.py: plans as torchtitan 0.3.0 recipes (exact text), 0.2.x TOML configs (parsed back)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from autopipe.config.megatron import megatron_args
from autopipe.config.titan_recipe import torchtitan_recipe
from autopipe.config.torchtitan import TORCH_SCHEDULES, torchtitan_schedule, torchtitan_toml
from autopipe.modes import Sharding
from autopipe.plans import Plan
from autopipe.schedules.registry import schedule_names, schedule_spec

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[2]
MLP_PLAN = ROOT / "tests" / "fixtures" / "good_mlp_plan_v1.json"


def _check_numbers(plan: Plan, config: dict[str, Any], t: int) -> None:
    """Every number of the TOML against the plan."""
    par, training = config["parallelism"], config["training"]
    assert par["tensor_parallel_degree"] == t
    assert par["pipeline_parallel_degree"] == plan.devices
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == plan.data_parallel
    assert par["pipeline_parallel_microbatch_size"] == plan.micro_batch_size
    assert training["local_batch_size"] == (plan.batch_size if plan.devices > 1 else plan.micro_batch_size)
    assert training["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == plan.micro_batches
    assert training["global_batch_size"] == plan.batch_size * plan.data_parallel
    assert par["module_fqns_per_model_part"] == [list(s.blocks) for s in plan.stages]
    assert len(par["module_fqns_per_model_part"]) == plan.devices * plan.virtual
    assert par["pipeline_parallel_schedule"] == schedule_spec(plan.schedule).torch_class.removeprefix("Schedule")
    recomputed = any(s.recompute for s in plan.stages)
    assert config["activation_checkpoint"]["mode"] == ("full" if recomputed else "none")


def test_every_schedule_has_a_name_torch_and_torchtitan_know(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.pipelining.schedules import get_schedule_class

    assert all(get_schedule_class(name).__name__ == f"Schedule{name}" for name in TORCH_SCHEDULES)
    for name in schedule_names():
        if torchtitan_schedule(name) in TORCH_SCHEDULES:
            assert get_schedule_class(torchtitan_schedule(name)).__name__ == schedule_spec(name).torch_class
    import autopipe.config.torchtitan as titan

    monkeypatch.setattr(titan, "torchtitan_schedule", lambda name: "NoSuchSchedule")  # a schedule torch lacks
    text = torchtitan_toml(Plan.load(MLP_PLAN), plan_file="runs/p.json")
    parallelism = tomllib.loads(text)["parallelism"]
    assert parallelism["pipeline_parallel_schedule"] == "1F1B"  # placement only: the CSV runs
    assert parallelism["pipeline_parallel_schedule_csv"] == "runs/p.schedule.csv"
    assert "# torch has no 1f1b schedule class: torchtitan runs the plan's exact order from " in text
    assert "\n# write the CSV first: autopipe emit runs/p.json --schedule-csv runs/p.schedule.csv\n" in text


def test_a_plan_file_as_toml_parses_back_with_the_plans_numbers() -> None:
    plan = Plan.load(MLP_PLAN)
    text = torchtitan_toml(plan)
    assert text.startswith("# torchtitan 0.2.x job config")
    _check_numbers(plan, tomllib.loads(text), t=1)
    assert "# torchtitan splits by top-level modules" in text  # 'layers.0.0' is nested
    assert "# the block(s) layers.2.0..head (stage 1) merge several modules" in text
    assert all(line.startswith("#") or "#" not in line for line in text.splitlines())


def test_partial_recompute_and_selective_are_said() -> None:
    plan = Plan.load(MLP_PLAN)
    partly = dataclasses.replace(
        plan, stages=tuple(dataclasses.replace(s, recompute=s.index == 1) for s in plan.stages)
    )
    text = torchtitan_toml(partly)
    assert tomllib.loads(text)["activation_checkpoint"]["mode"] == "full"
    assert (
        "# the plan recomputes stage(s) 1 only; torchtitan's mode is one for all stages, so stage(s) 0 recompute too"
        in text
    )
    selective = tomllib.loads(torchtitan_toml(plan, selective_recompute=True))["activation_checkpoint"]
    assert selective == {"mode": "selective", "selective_ac_option": "op"}
    assert "    config.activation_checkpoint = SelectiveAC.Config()\n" in torchtitan_recipe(
        plan, selective_recompute=True
    )


@pytest.mark.slow  # the gpt_plans fixture plans two models (once per session)
def test_real_gpt_plans_uneven_and_interleaved_3d(gpt_plans: dict[str, Path]) -> None:
    uneven = Plan.load(gpt_plans["uneven"])
    _check_numbers(uneven, tomllib.loads(torchtitan_toml(uneven)), t=1)
    plan = Plan.load(gpt_plans["interleaved"])
    assert plan.tensor_parallel == 2 and plan.sequence_parallel  # a 3D plan, from the planner
    text = torchtitan_toml(plan)
    config = tomllib.loads(text)
    _check_numbers(plan, config, t=2)
    par = config["parallelism"]
    assert (
        par["pipeline_parallel_schedule"] == "Interleaved1F1B"
        and par["data_parallel_shard_degree"] == plan.data_parallel
    )
    assert "# torchtitan 0.2.x runs DDP only without other parallelism" in text
    assert (
        par["module_fqns_per_model_part"][0][:2] == ["wte", "wpe"]
        and par["module_fqns_per_model_part"][-1][-1] == "lm_head"
    )
    assert "# torchtitan places" not in text  # round robin, as the plan
    recipe = torchtitan_recipe(plan)  # 0.3.0 replicates beside tensor and pipeline parallelism, as planned
    assert f"    config.parallelism.data_parallel_replicate_degree = {plan.data_parallel}\n" in recipe
    assert "    config.parallelism.tensor_parallel_degree = 2\n" in recipe and "runs DDP only" not in recipe
    assert "    config.parallelism.enable_sequence_parallel = True\n" in recipe  # the plan's sequence parallelism
    no_sp = torchtitan_recipe(plan, sequence_parallel=False)
    assert "    config.parallelism.enable_sequence_parallel = False\n" in no_sp and "always shards" not in no_sp
    assert "# torchtitan 0.2.x's tensor parallelism always shards" in torchtitan_toml(plan, sequence_parallel=False)
    zero1 = torchtitan_toml(plan, zero1=True)
    assert tomllib.loads(zero1)["parallelism"]["data_parallel_shard_degree"] == plan.data_parallel
    assert f"# the plan's ZeRO-1 over {plan.data_parallel} replicas is FSDP here" in zero1
    spec = schedule_spec("zb-v")
    v_plan = dataclasses.replace(
        plan,
        schedule="zb-v",
        stages=tuple(
            dataclasses.replace(s, rank=spec.device_of(s.index, plan.devices, plan.virtual)) for s in plan.stages
        ),
    )
    v_text = torchtitan_toml(v_plan)
    assert tomllib.loads(v_text)["parallelism"]["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    assert "# torchtitan places" not in v_text  # a V, as the plan


def _gpt_like(
    split: tuple[tuple[str, ...], ...] = (
        ("wte", "wpe", "blocks.0", "blocks.1"),
        ("blocks.2", "blocks.3", "ln_f", "lm_head"),
    ),
    schedule: str = "1f1b",
    virtual: int = 1,
    micro_batches: int = 4,
    micro_batch_size: int = 2,
    data: int = 1,
    recompute: bool = False,
    dtype: str = "bf16",
) -> Plan:
    """A plan of a GPT-like model (``wte``, ``blocks.N``, ``lm_head``) made from the MLP fixture's."""
    plan = Plan.load(MLP_PLAN)
    devices = len(split) // virtual
    spec = schedule_spec(schedule)
    stages = tuple(
        dataclasses.replace(
            plan.stages[0], index=i, rank=spec.device_of(i, devices, virtual), blocks=blocks, recompute=recompute
        )
        for i, blocks in enumerate(split)
    )
    return dataclasses.replace(
        plan,
        model="models/gpt.py:build_model",
        profile_device=f"h100: NVIDIA H100 SXM (analytic, {dtype})",
        devices=devices,
        virtual=virtual,
        schedule=schedule,
        micro_batches=micro_batches,
        micro_batch_size=micro_batch_size,
        batch_size=micro_batches * micro_batch_size,
        data_parallel=data,
        stages=stages,
    )


RECIPE_2DEV = """\
# torchtitan 0.3.0 recipe (Trainer.Config) for models/gpt.py:build_model
# autopipe plan: 1f1b, t x p x d = 1 x 2 x 2 = 4 GPUs, 4 micro-batch(es) of 2
# save as autopipe_recipe.py where Python finds it (PYTHONPATH), then run:
#   torchrun --nproc-per-node 4 -m torchtitan.train --module autopipe_recipe --config autopipe_plan
# (several nodes: torchrun --nnodes N --nproc-per-node G with N x G = the GPUs above)
# base_config is the recipe of the model you train (its model_spec, seq_len, data, optimizer);
# the module names below are your model's

from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.models.llama3.config_registry import llama3_debugmodel as base_config
from torchtitan.trainer import Trainer


def autopipe_plan() -> Trainer.Config:
    config = base_config()
    config.training.local_batch_size = 8
    config.training.global_batch_size = 16
    config.training.mixed_precision_param = "bfloat16"
    config.training.disable_cuda_graphs = True  # torchtitan's CUDA graphs do not take a pipeline
    config.parallelism.data_parallel_replicate_degree = 2
    config.parallelism.data_parallel_shard_degree = 1
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 2
    config.parallelism.pipeline_parallel_schedule = "1F1B"
    config.parallelism.pipeline_parallel_microbatch_size = 2
    config.parallelism.module_fqns_per_model_part = [
        ["wte", "wpe", "blocks.0", "blocks.1"],
        ["blocks.2", "blocks.3", "ln_f", "lm_head"],
    ]
    config.activation_checkpoint = FullAC.Config()
    return config
"""

TOML_NO_PIPELINE = """\
# torchtitan 0.2.x job config (the fields of torchtitan/config/job_config.py, v0.2.1-2) for models/gpt.py:build_model
# autopipe plan: 1f1b, t x p x d = 1 x 1 x 1 = 1 GPUs, 2 micro-batch(es) of 16
# no pipeline: each data-parallel rank runs 2 micro-batches of 16 as gradient accumulation \
(global_batch_size / local_batch_size / replicas)
# [model] name/flavor and training.seq_len are the model's own: set them to the torchtitan model that is yours \
(the module names below are your model's)

[training]
local_batch_size = 16
global_batch_size = 32
mixed_precision_param = "bfloat16"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = 1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
pipeline_parallel_schedule = "1F1B"
pipeline_parallel_microbatch_size = 16
module_fqns_per_model_part = [
  ["wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"],
]

[activation_checkpoint]
mode = "none"
"""


def test_a_recipe_for_torchtitan_0_3_0_exactly() -> None:
    plan = _gpt_like(data=2, recompute=True)
    notes = "# full: torchtitan checkpoints each transformer layer (the plan prices each stage as one piece)\n"
    expected = RECIPE_2DEV.replace("4 micro-batch(es) of 2\n", "4 micro-batch(es) of 2\n" + notes)
    assert torchtitan_recipe(plan) == expected
    compile(expected, "autopipe_recipe.py", "exec")


def test_no_pipeline_runs_one_micro_batch_a_pass_in_both_versions() -> None:
    whole = ("wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head")
    plan = _gpt_like(split=(whole,), micro_batches=2, micro_batch_size=16)
    assert torchtitan_toml(plan) == TOML_NO_PIPELINE
    recipe = torchtitan_recipe(dataclasses.replace(plan, data_parallel=2))
    assert "    config.training.local_batch_size = 16\n    config.training.global_batch_size = 64\n" in recipe
    assert "    config.parallelism.data_parallel_replicate_degree = 2\n" in recipe
    assert "disable_cuda_graphs" not in recipe  # no pipeline: torchtitan's CUDA graphs may stay


def test_precision_without_shards_and_fp16_and_fp32() -> None:
    pipelined = tomllib.loads(torchtitan_toml(_gpt_like()))["training"]  # p = 2, d = 1: no FSDP in 0.2.x
    assert pipelined == {
        "local_batch_size": 8,
        "global_batch_size": 8,
        "mixed_precision_param": "bfloat16",
        "dtype": "bfloat16",
    }
    assert "# torchtitan 0.2.x applies mixed precision only with FSDP" in torchtitan_toml(_gpt_like())
    sharded = tomllib.loads(torchtitan_toml(_gpt_like(data=2)))
    assert "dtype" not in sharded["training"] and sharded["parallelism"]["data_parallel_shard_degree"] == 2
    assert 'config.training.mixed_precision_param = "float32"' in torchtitan_recipe(_gpt_like(dtype="fp32"))
    fp16 = torchtitan_recipe(_gpt_like(dtype="fp16"))
    assert 'mixed_precision_param = "bfloat16"' in fp16
    assert "# the plan is priced in fp16; torchtitan trains in bfloat16 or float32: bfloat16 here" in fp16


def test_merged_blocks_are_expanded_or_said() -> None:
    plan = _gpt_like(split=(("wte..blocks.1",), ("blocks.2..blocks.3", "ln_f", "lm_head")))
    config = tomllib.loads(torchtitan_toml(plan))
    assert config["parallelism"]["module_fqns_per_model_part"] == [
        ["wte..blocks.1"],
        ["blocks.2", "blocks.3", "ln_f", "lm_head"],
    ]
    line = (
        "# the block(s) wte..blocks.1 (stage 0) merge several modules, which pipeline_module_split cannot place "
        "by one name: put the module names each covers in its place, or plan with finer blocks"
    )
    assert line in torchtitan_toml(plan).splitlines() and line in torchtitan_recipe(plan).splitlines()


def test_v_shapes_dualpipe_v_and_the_head_spread() -> None:
    split = (("wte", "blocks.0"), ("blocks.1",), ("blocks.2", "blocks.3", "ln_f"), ("lm_head",))
    v_min = _gpt_like(split=split, schedule="v-min", virtual=2)
    for text in (torchtitan_toml(v_min, plan_file="vmin.json"), torchtitan_recipe(v_min, plan_file="vmin.json")):
        assert "the frameworks put it all" not in text  # torchtitan places ln_f and lm_head by name
        assert (
            "# torch has no v-min schedule class: torchtitan runs the plan's exact order from "
            "pipeline_parallel_schedule_csv (vmin.schedule.csv); pipeline_parallel_schedule = ZBVZeroBubble "
            "only places the stages (in a V)\n" in text
        )
        assert "# write the CSV first: autopipe emit vmin.json --schedule-csv vmin.schedule.csv\n" in text
        assert "schedule ()" not in text and "torchtitan places" not in text  # the plan's V is torchtitan's
    assert tomllib.loads(torchtitan_toml(v_min))["parallelism"]["pipeline_parallel_schedule_csv"] == "plan.schedule.csv"
    recomputed = dataclasses.replace(v_min, stages=tuple(dataclasses.replace(s, recompute=True) for s in v_min.stages))
    text = torchtitan_toml(recomputed)  # the CSV cannot say recomputation: torchtitan's own class runs instead
    assert "pipeline_parallel_schedule_csv" not in text
    assert (
        "# torch has no v-min schedule class and autopipe writes no schedule CSV for this plan (stage(s) 0-3 "
        "recompute, and torch's schedule CSV has no recomputation action): torchtitan runs ZBVZeroBubble "
        "with these stages\n" in text
    )
    from autopipe.errors import PlanError
    from autopipe.stages.schedule_csv import schedule_csv

    with pytest.raises(PlanError, match="recompute"):  # the same refusal as autopipe emit's
        schedule_csv(recomputed)
    schedule_csv(v_min)
    assert "the frameworks put it all on the last stage" in megatron_args(v_min)  # Megatron does
    dual = _gpt_like(split=split, schedule="dualpipe-v", virtual=2)
    par = tomllib.loads(torchtitan_toml(dual))["parallelism"]
    assert (
        par["pipeline_parallel_schedule"] == "DualPipeV" and par["pipeline_parallel_expert_parallel_overlap"] is False
    )
    recipe = torchtitan_recipe(dual)
    assert 'pipeline_parallel_schedule = "DualPipeV"' in recipe and "overlap" not in recipe  # 0.3.0 has no such field


def _loader_plans() -> dict[str, Plan]:
    """Plans of every shape the loader check reads: even, uneven, interleaved, V, recompute, no pipeline, t = 2."""
    v_split = (("wte", "wpe", "blocks.0"), ("blocks.1",), ("blocks.2",), ("blocks.3", "ln_f", "lm_head"))
    whole = (("wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"),)
    return {
        "even": _gpt_like(data=2),
        "uneven": _gpt_like(
            split=(("wte", "wpe", "blocks.0", "blocks.1", "blocks.2"), ("blocks.3", "ln_f", "lm_head"))
        ),
        "interleaved": _gpt_like(split=v_split, schedule="interleaved-1f1b", virtual=2, data=4),
        "zb-v": _gpt_like(split=v_split, schedule="zb-v", virtual=2),
        "dualpipe-v": _gpt_like(split=v_split, schedule="dualpipe-v", virtual=2),
        "v-half": _gpt_like(split=v_split, schedule="v-half", virtual=2),
        "recompute": _gpt_like(recompute=True, dtype="fp32"),
        "no-pipeline": _gpt_like(split=whole, micro_batches=2, micro_batch_size=16, data=2),
        "tensor-2": dataclasses.replace(_gpt_like(data=2), tensor_parallel=2, sequence_parallel=True),
        "fsdp-step-hybrid": _sharded(_gpt_like(data=4), Sharding.ZERO3_STEP, 2),
        "fsdp-alone": _sharded(_gpt_like(split=whole, micro_batches=2, micro_batch_size=16, data=4), Sharding.ZERO3),
    }


_RESHARD = {"fsdp-step-hybrid": "never", "fsdp-alone": "always"}  # the loader plans' fsdp_reshard_after_forward


def _sharded(plan: Plan, kind: Sharding, group: int = 0) -> Plan:
    return dataclasses.replace(plan, sharding=kind, shard_optimizer=True, shard_group=group)


@pytest.mark.parametrize(
    ("kind", "group", "stages", "degrees", "reshard", "note"),
    [
        (Sharding.NONE, 0, 2, (4, 1), "default", None),  # replicas: DDP (fully_shard's replicate dimension)
        (Sharding.ZERO3_STEP, 0, 2, (1, 4), "never", None),  # FSDP2 gathering once a step
        (Sharding.ZERO3_STEP, 2, 2, (2, 2), "never", None),  # HSDP: 2-way shards, each twice
        (Sharding.ZERO3, 0, 1, (1, 4), "always", None),  # FSDP2 resharding after each forward
        (Sharding.ZERO3, 0, 2, (1, 4), "always", "torch's pipeline stages reduce the gradients once a step"),
        (Sharding.ZERO1, 0, 2, (1, 4), "never", "torchtitan has no ZeRO-1 or -2"),
    ],
)
def test_shardings_are_fsdp_and_hsdp_degrees(
    kind: Sharding, group: int, stages: int, degrees: tuple[int, int], reshard: str, note: str | None
) -> None:
    whole = (("wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"),)
    base = _gpt_like(data=4) if stages == 2 else _gpt_like(split=whole, micro_batches=2, micro_batch_size=16, data=4)
    plan = _sharded(base, kind, group) if kind != Sharding.NONE else base
    recipe = torchtitan_recipe(plan)  # 0.3.0
    said = [f"data_parallel_replicate_degree = {degrees[0]}\n", f"data_parallel_shard_degree = {degrees[1]}\n"]
    assert all(line in recipe for line in said)
    assert (f'fsdp_reshard_after_forward = "{reshard}"' in recipe) == (reshard != "default")
    par = tomllib.loads(torchtitan_toml(plan))["parallelism"]  # 0.2.x: DDP only alone, so replicas are shards there
    ddp_alone = kind == Sharding.NONE and stages > 1
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (
        (1, 4) if ddp_alone else degrees
    )
    assert par.get("fsdp_reshard_after_forward", "default") == reshard
    assert (note is None) or note in recipe


def _torchtitan_version(prefix: str) -> None:
    """Skip unless the torchtitan installed is of the release line ``prefix`` (``"0.3."``)."""
    version = str(getattr(pytest.importorskip("torchtitan"), "__version__", ""))
    if not version.startswith(prefix):
        pytest.skip(f"torchtitan {version} is installed, this checks {prefix}x")


@pytest.mark.slow  # imports torchtitan (about 20 s)
def test_torchtitan_0_2_loads_every_toml(tmp_path: Path) -> None:
    """torchtitan 0.2.x's own ConfigManager reads each TOML (``--job.config_file``): the plan's fields."""
    _torchtitan_version("0.2.")
    from torchtitan.config import ConfigManager

    plans = _loader_plans()
    for name, plan in plans.items():
        (tmp_path / f"{name}.toml").write_text(torchtitan_toml(plan))
        config = ConfigManager().parse_args(["--job.config_file", str(tmp_path / f"{name}.toml")])
        par, training = config.parallelism, config.training
        assert par.module_fqns_per_model_part == [list(s.blocks) for s in plan.stages], name
        assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == plan.data_parallel, name
        assert par.fsdp_reshard_after_forward == _RESHARD.get(name, "default"), name
        assert training.global_batch_size == plan.batch_size * plan.data_parallel, name
        assert par.pipeline_parallel_expert_parallel_overlap == (name != "dualpipe-v"), name
        assert config.activation_checkpoint.mode == ("full" if name == "recompute" else "none"), name
        bf16_throughout = plan.devices > 1 and par.data_parallel_shard_degree == 1 and name != "recompute"
        assert training.dtype == ("bfloat16" if bf16_throughout else "float32"), name


@pytest.mark.slow  # imports torchtitan (about 20 s)
def test_torchtitan_0_3_0_loads_every_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan's own ConfigManager reads each recipe as a user's launch would (``--module``,
    ``--config``), building the Trainer.Config again (its checks run): the fields are the plan's."""
    _torchtitan_version("0.3.")
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    plans = _loader_plans()
    for name, plan in plans.items():
        module = "recipe_" + name.replace("-", "_")
        (tmp_path / f"{module}.py").write_text(torchtitan_recipe(plan, module=module))
        config = ConfigManager().parse_args(["--module", module, "--config", "autopipe_plan"])
        par, training = config.parallelism, config.training
        assert par.pipeline_parallel_degree == plan.devices and par.tensor_parallel_degree == plan.tensor_parallel, name
        assert par.data_parallel_replicate_degree * par.data_parallel_shard_degree == plan.data_parallel, name
        assert par.fsdp_reshard_after_forward == _RESHARD.get(name, "default"), name
        assert par.module_fqns_per_model_part == [list(s.blocks) for s in plan.stages], name
        assert par.pipeline_parallel_microbatch_size == plan.micro_batch_size, name
        assert training.global_batch_size == plan.batch_size * plan.data_parallel, name
        steps = training.global_batch_size // (training.local_batch_size * plan.data_parallel)
        pp_micro = training.local_batch_size // par.pipeline_parallel_microbatch_size if plan.devices > 1 else 1
        assert steps * pp_micro == plan.micro_batches, name  # torchtitan's accumulation x its micro-batches
        recomputed = any(s.recompute for s in plan.stages)
        assert (
            isinstance(config.activation_checkpoint, FullAC.Config)
            if recomputed
            else config.activation_checkpoint is None
        )
        assert training.mixed_precision_param == ("float32" if name == "recompute" else "bfloat16"), name
    selective = torchtitan_recipe(plans["even"], selective_recompute=True, module="recipe_selective")
    (tmp_path / "recipe_selective.py").write_text(selective)
    config = ConfigManager().parse_args(["--module", "recipe_selective", "--config", "autopipe_plan"])
    assert isinstance(config.activation_checkpoint, SelectiveAC.Config)
    no_graphs_line = "".join(line for line in selective.splitlines(keepends=True) if "disable_cuda_graphs" not in line)
    (tmp_path / "recipe_graphs.py").write_text(no_graphs_line)
    with pytest.raises(SystemExit):  # the check is real: torchtitan refuses CUDA graphs with a pipeline
        ConfigManager().parse_args(["--module", "recipe_graphs", "--config", "autopipe_plan"])


@pytest.mark.slow  # imports torchtitan (about 20 s)
def test_torchtitan_0_3_0_places_and_splits_as_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan's own stage placement (rank -> stages, round robin or V) gives each rank the plan's
    stages, and its module split keeps exactly each part's modules of models/gpt.py."""
    _torchtitan_version("0.3.")
    import importlib.util

    from torchtitan.distributed import pipeline_parallel as tt_pp

    spec = importlib.util.spec_from_file_location("autopipe_test_gpt", ROOT / "models" / "gpt.py")
    assert spec is not None and spec.loader is not None
    gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpt)
    model = gpt.build_model(n_layer=4)
    for name, plan in _loader_plans().items():
        if plan.devices == 1:
            continue
        schedule = next(
            line.split('"')[1]
            for line in torchtitan_recipe(plan).splitlines()
            if line.startswith("    config.parallelism.pipeline_parallel_schedule =")
        )
        for rank in range(plan.devices):
            placed = tt_pp._get_pp_rank_to_stage_indices_mapping(rank, plan.devices, schedule, len(plan.stages))
            assert sorted(placed) == [s.index for s in plan.stages if s.rank == rank], (name, rank)
        covered: set[str] = set()
        layers = 0
        for stage in plan.stages:
            part = tt_pp._split_module(model, list(stage.blocks))
            names = sorted(n for n, m in part.named_children() if m is not None and not (n == "blocks" and not len(m)))
            assert names == sorted({b.split(".")[0] for b in stage.blocks}), (name, stage.index)
            assert len(part.blocks) == sum(b.startswith("blocks.") for b in stage.blocks), (name, stage.index)
            covered |= set(names)
            layers += len(part.blocks)
        assert layers == 4 and covered == {"wte", "wpe", "blocks", "ln_f", "lm_head"}, name  # the parts cover the model


def _config_lines(text: str) -> set[str]:
    return {line for line in text.splitlines() if line.startswith("    config.")}


def test_the_main_recipe_counts_tokens_and_names_the_commit_it_was_checked_at(tmp_path: Path) -> None:
    from autopipe.cli.main import main

    from autopipe.config.titan_recipe import TORCHTITAN_MAIN_COMMIT
    from autopipe.errors import ConfigError

    plan = _gpt_like(data=2)  # 4 micro-batches of 2, 2 replicas
    text = torchtitan_recipe(plan, version="main")
    assert text.startswith(
        f"# torchtitan main recipe (Trainer.Config, commit {TORCHTITAN_MAIN_COMMIT[:12]} of 2026-08-21)"
    )
    assert "    config.training.num_tokens_per_microbatch_per_dp_rank = 2 * seq\n" in text
    assert "    config.training.num_tokens_per_train_step = 16 * seq\n" in text  # 4 x 2 samples x 2 replicas
    assert "    config.parallelism.num_pp_microbatches = 4\n" in text
    for gone in ("local_batch_size", "global_batch_size", "pipeline_parallel_microbatch_size", "seq_len"):
        assert gone not in text, gone  # #4121 renamed them
    assert _config_lines(text) - _config_lines(torchtitan_recipe(plan)) == {  # all else is 0.3.0's, line for line
        "    config.training.num_tokens_per_microbatch_per_dp_rank = 2 * seq",
        "    config.training.num_tokens_per_train_step = 16 * seq",
        "    config.parallelism.num_pp_microbatches = 4",
    }
    whole = (("wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"),)
    alone = torchtitan_recipe(_gpt_like(split=whole, micro_batches=2, micro_batch_size=16), version="main")
    assert "num_tokens_per_microbatch_per_dp_rank = 16 * seq\n" in alone and "num_pp_microbatches = 1\n" in alone
    assert "(num_tokens_per_train_step / num_tokens_per_microbatch_per_dp_rank / replicas)" in alone
    with pytest.raises(ConfigError, match=r"torchtitan version '0\.4' has no recipe form in autopipe"):
        torchtitan_recipe(plan, version="0.4")
    out = tmp_path / "titan_main.py"
    assert main(["config", str(MLP_PLAN), "--for", "torchtitan-main", "-o", str(out)]) == 0
    want = torchtitan_recipe(Plan.load(MLP_PLAN), version="main", module="titan_main", plan_file=str(MLP_PLAN))
    assert out.read_text() == want
