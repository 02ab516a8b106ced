"""An fp8 plan (priced with Transformer Engine's FP8 linear layers) as framework configs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import tomllib

from autopipe.config.megatron import megatron_args
from autopipe.config.titan_recipe import torchtitan_recipe
from autopipe.config.torchtitan import torchtitan_toml
from autopipe.plans import Plan

MLP_PLAN = Path(__file__).parents[1] / "fixtures" / "good_mlp_plan_v1.json"
FP8 = "h100: NVIDIA H100 SXM5 80GB (analytic, fp8)"


def _plan(device: str = FP8) -> Plan:
    return dataclasses.replace(Plan.load(MLP_PLAN), profile_device=device)


def test_an_fp8_plan_says_so() -> None:
    assert _plan().precision == "fp8" and _plan(FP8.replace("fp8", "bf16")).precision == "bf16"


def test_megatron_trains_fp8_with_bf16_and_the_hybrid_format() -> None:
    lines = megatron_args(_plan()).splitlines()
    assert "--bf16" in lines and "--fp8-format hybrid" in lines
    assert "--fp8-format hybrid" not in megatron_args(_plan(FP8.replace("fp8", "bf16")))


def test_torchtitan_toml_converts_linears_to_float8_and_the_recipe_says_how() -> None:
    config = tomllib.loads(torchtitan_toml(_plan()))
    assert config["model"]["converters"] == ["quantize.linear.float8"]
    assert config["training"]["mixed_precision_param"] == "bfloat16"
    assert "model" not in tomllib.loads(torchtitan_toml(_plan(FP8.replace("fp8", "bf16"))))
    recipe = torchtitan_recipe(_plan())
    assert "# the plan is priced in fp8 (linear layers in float8, the rest in bf16)" in recipe
    assert "converters=[Float8LinearConverter.Config()]" in recipe
