"""autopipe/config/torchtitan.py: plans as torchtitan 0.2.x TOML job configs, parsed back."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from autopipe.config.torchtitan import TORCH_SCHEDULES, torchtitan_schedule, torchtitan_toml
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
    assert training["local_batch_size"] == plan.batch_size
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
    text = torchtitan_toml(Plan.load(MLP_PLAN))
    assert tomllib.loads(text)["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    assert "# torch has no 1f1b schedule (NoSuchSchedule); torchtitan runs 1F1B with these stages instead" in text


def test_a_plan_file_as_toml_parses_back_with_the_plans_numbers() -> None:
    plan = Plan.load(MLP_PLAN)
    text = torchtitan_toml(plan)
    assert text.startswith("# torchtitan 0.2.x job config")
    _check_numbers(plan, tomllib.loads(text), t=1)
    assert "# torchtitan splits by top-level modules" in text  # 'layers.0.0' is nested
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
    assert "# torchtitan runs DDP only without other parallelism" in text
    assert (
        par["module_fqns_per_model_part"][0][:2] == ["wte", "wpe"]
        and par["module_fqns_per_model_part"][-1][-1] == "lm_head"
    )
    assert "# torchtitan places" not in text  # round robin, as the plan
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
