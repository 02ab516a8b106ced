"""A plan's uniform memory choice in the frameworks' words (config/megatron.py, config/torchtitan.py):
Megatron-LM's own flags, checked against its argument names (megatron/training/arguments.py builds
them from TransformerConfig's fields: recompute_granularity, recompute_method, recompute_num_layers,
recompute_modules, fine_grained_activation_offloading, offload_modules), and a ``#`` line for what a
framework cannot say."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from autopipe import api
from autopipe.config.megatron import megatron_args
from autopipe.config.torchtitan import TORCHTITAN_TOML_VERSION, titan_job
from autopipe.costs.devices import device_spec
from autopipe.plans import Plan

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan() -> Plan:
    """A GPT plan of 4 layers on 2 H100s, nothing recomputed."""
    h100 = device_spec("h100")
    profile = api.price(api.count(str(ROOT / "models" / "gpt.py"), {}, h100), h100)
    return api.plan_profile(profile, stages=2, batch_size=8, memory="80GB", choices=api.Choices(schedule="1f1b"))


def _args(text: str) -> list[str]:
    return [w for line in text.splitlines() if not line.startswith("#") for w in shlex.split(line)]


def _notes(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("# ")]


def test_selective_recomputation(plan: Plan) -> None:
    text = megatron_args(dataclasses.replace(plan, recompute_modules=("core_attn", "layernorm")))
    args = _args(text)
    i = args.index("--recompute-modules")
    assert args[i - 2 : i] == ["--recompute-granularity", "selective"] and args[i + 1 :] == ["core_attn", "layernorm"]
    assert "--recompute-method" not in args


def test_the_dense_activation_alone_becomes_the_mlp_with_a_note(plan: Plan) -> None:
    text = megatron_args(dataclasses.replace(plan, recompute_modules=("layernorm", "mlp_act")))
    args = _args(text)
    assert args[args.index("--recompute-modules") + 1 :] == ["layernorm", "mlp"]
    assert any("recomputes only in MoE experts (moe_act)" in n for n in _notes(text))


def test_fp8_with_layernorm_recomputation_asks_for_current_scaling(plan: Plan) -> None:
    fp8 = dataclasses.replace(plan, profile_device="h100: NVIDIA H100 SXM5 80GB (analytic, fp8)")
    args = _args(megatron_args(dataclasses.replace(fp8, recompute_modules=("layernorm",))))
    assert args[args.index("--fp8-recipe") + 1] == "tensorwise"


def test_the_block_method(plan: Plan) -> None:
    stages = tuple(dataclasses.replace(s, transient_bytes=1.0) for s in plan.stages)
    args = _args(megatron_args(dataclasses.replace(plan, recompute_layers=2, stages=stages)))
    tail = args[args.index("--recompute-granularity") :]
    assert tail == ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"]


def test_offload_and_its_environment(plan: Plan) -> None:
    text = megatron_args(dataclasses.replace(plan, offload_modules=("core_attn", "qkv_linear")))
    args = _args(text)
    i = args.index("--fine-grained-activation-offloading")
    assert args[i + 1 :] == ["--offload-modules", "core_attn", "qkv_linear"]
    launch = next(n for n in _notes(text) if n.startswith("# launch:"))
    assert launch.startswith("# launch: NVTE_CPU_OFFLOAD_V1=1 torchrun")


def test_torchtitan_recomputes_whole_layers_and_says_why(plan: Plan) -> None:
    for chosen in (
        dataclasses.replace(plan, recompute_modules=("mlp",)),
        dataclasses.replace(plan, recompute_layers=1),
        dataclasses.replace(plan, offload_modules=("core_attn",)),
    ):
        job = titan_job(chosen, TORCHTITAN_TOML_VERSION, (None, None, None, None))
        assert job.recompute == "full"
        assert any("torchtitan has no" in n and chosen.memory_choice in n for n in job.notes)


def test_a_flag_and_all_its_values_are_one_line(plan: Plan) -> None:
    """``--recompute-modules core_attn layernorm`` on one line, not its second value alone (a
    line of its own reads as a stray word to whoever edits the file by flags)."""
    text = megatron_args(dataclasses.replace(plan, recompute_modules=("core_attn", "layernorm")))
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert "--recompute-modules core_attn layernorm" in lines
    assert all(line.startswith("--") for line in lines)
