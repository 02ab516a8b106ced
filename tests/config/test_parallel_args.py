"""Expert and context parallelism in Megatron-LM's and torchtitan's words (config/parallel_args.py):
the MoE definition read from the bundled presets and Hugging Face configs, the arguments, and
a plan of the tiny MoE through ``autopipe.api.megatron_config`` and the torchtitan TOML."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import tomllib
import torch

from autopipe.config.parallel_args import MoEFacts, layer_freq, megatron_parallel_args, read_moe, titan_parallel_lines
from autopipe.config.parts import Degrees, degrees
from autopipe.config.torchtitan import torchtitan_toml
from autopipe.model.load import load_model
from tests.helpers import FIXTURES, ROOT, even_plan

MOE = str(ROOT / "models" / "moe.py")


def _deg(**kw: int) -> Degrees:
    return dataclasses.replace(Degrees(2, 4, 8, 1, True, False), **kw)


def test_the_moe_layer_frequency_is_megatrons_list_expression() -> None:
    assert layer_freq((False,) * 3 + (True,) * 58) == "([0]*3+[1]*58)"
    assert layer_freq((True,) * 94) is None  # every layer: Megatron's default
    assert layer_freq((True, False, True, True)) == "([1]*1+[0]*1+[1]*2)"


@pytest.mark.parametrize(
    ("preset", "facts"),
    [
        (
            "deepseek-v3",
            MoEFacts(256, 8, 2048, (False,) * 3 + (True,) * 58, 2048, "sigmoid", 2.5, (1536, 512, 128, 64, 128), 1),
        ),
        ("qwen3-235b-a22b", MoEFacts(128, 8, 1536, (True,) * 94, qk_norm=True)),
        ("mixtral-8x7b", MoEFacts(8, 2, 14336, (True,) * 32)),
    ],
)
def test_the_presets_moe_definitions_are_read(preset: str, facts: MoEFacts) -> None:
    model = load_model(MOE, {"preset": preset}, device="meta").model
    assert read_moe(model, "layers") == facts


@pytest.mark.slow
def test_hugging_face_moe_definitions_are_read() -> None:
    zoo = str(FIXTURES / "hf_zoo.py")
    deepseek = load_model(zoo, {"arch": "deepseek_v3"}, device="meta").model
    assert read_moe(deepseek, "model.layers") == MoEFacts(
        8, 2, 16, (False, True, True), 16, "sigmoid", 2.5, (16, 16, 8, 8, 8), 0
    )  # HF's DeepseekV3Config defaults: sigmoid scores scaled 2.5; its modules hold no MTP layer
    qwen = load_model(zoo, {"arch": "qwen3_moe"}, device="meta").model
    assert read_moe(qwen, "model.layers") == MoEFacts(8, 2, 16, (True, True), qk_norm=True)
    assert read_moe(load_model(zoo, {"arch": "llama"}, device="meta").model, "model.layers") is None


def test_megatron_arguments_for_deepseek_v3_on_ep_64() -> None:
    facts = MoEFacts(256, 8, 2048, (False,) * 3 + (True,) * 58, 2048, "sigmoid", 2.5, (1536, 512, 128, 64, 128), 1)
    args, notes = megatron_parallel_args(_deg(tensor=1, expert=64), facts)
    assert args == [
        *("--num-experts", "256", "--moe-router-topk", "8", "--moe-ffn-hidden-size", "2048"),
        *("--expert-model-parallel-size", "64", "--expert-tensor-parallel-size", "1"),
        *("--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"),
        *("--moe-layer-freq", "([0]*3+[1]*58)", "--moe-shared-expert-intermediate-size", "2048"),
        *("--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"),
        *("--moe-router-topk-scaling-factor", "2.5"),
        *("--multi-latent-attention", "--q-lora-rank", "1536", "--kv-lora-rank", "512"),
        *("--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128", "--mtp-num-layers", "1"),
    ]
    assert notes == []
    cp, _ = megatron_parallel_args(_deg(context=16), None)
    assert cp == ["--context-parallel-size", "16", "--cp-comm-type", "p2p"]
    _, warned = megatron_parallel_args(_deg(sequence_parallel=False), facts)
    assert warned == ["Megatron-Core needs --sequence-parallel for MoE layers with tensor parallelism (t > 1)"]
    _, missing = megatron_parallel_args(_deg(expert=4), None)
    assert "no routed experts were read from the model" in missing[0]
    assert megatron_parallel_args(_deg(), None) == ([], [])  # a dense plan: nothing


def test_torchtitan_lines_and_where_its_expert_group_cannot_form() -> None:
    assert titan_parallel_lines(_deg(), 8) == ([], [])
    lines, notes = titan_parallel_lines(_deg(context=2, expert=8, expert_tensor=2), 8)
    assert lines == ["context_parallel_degree = 2", "expert_parallel_degree = 8", "expert_tensor_parallel_degree = 2"]
    assert notes == []
    _, notes = titan_parallel_lines(_deg(expert=8, expert_tensor=4), 1)
    assert "ep divides them" in notes[0] and "1 or t (2), not 4" in notes[1]


@pytest.fixture(scope="module")
def moe_plan() -> object:
    torch.set_num_threads(1)
    plan = even_plan(MOE, stages=2, micro_batch_size=2)
    return dataclasses.replace(plan, data_parallel=4, context_parallel=2, expert_parallel=8)


def test_a_plan_of_the_tiny_moe_as_megatron_arguments(moe_plan: object) -> None:
    from autopipe.api import megatron_config

    text = megatron_config(moe_plan)  # type: ignore[arg-type]
    lines = text.splitlines()
    assert "# world size t x cp x p x d = 1 x 2 x 2 x 4 = 16 GPUs" in lines
    assert "# environment: CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron asserts it for context parallelism" in text
    args = [line for line in lines if not line.startswith("#")]
    for want in (
        "--context-parallel-size 2",
        "--num-experts 8",
        "--moe-router-topk 2",
        "--moe-ffn-hidden-size 64",
        "--expert-model-parallel-size 8",
        "--moe-layer-freq '([0]*1+[1]*3)'",
        "--moe-shared-expert-intermediate-size 64",
        "--kv-lora-rank 32",
        "--mtp-num-layers 1",
        "--global-batch-size 16",  # 4 samples per pipeline x 4 replicas; CP ranks share their samples
    ):
        assert want in args, want
    assert degrees(moe_plan).world_size == 16  # type: ignore[arg-type]


def test_a_plan_of_the_tiny_moe_as_torchtitan_toml(moe_plan: object) -> None:
    parallelism = tomllib.loads(torchtitan_toml(moe_plan))["parallelism"]  # type: ignore[arg-type]
    assert (parallelism["context_parallel_degree"], parallelism["expert_parallel_degree"]) == (2, 8)
    plain = dataclasses.replace(moe_plan, context_parallel=1, expert_parallel=1)  # type: ignore[type-var]
    assert "expert_parallel_degree" not in torchtitan_toml(plain)  # degree 1: written as before


def test_a_plan_that_hides_the_expert_all_to_all_says_so_to_both_frameworks(moe_plan: object) -> None:
    from autopipe.api import megatron_config

    plan: Any = moe_plan
    hidden = dataclasses.replace(plan, overlap=dataclasses.replace(plan.overlap, expert_comm=True))
    assert "--overlap-moe-expert-parallel-comm" in megatron_config(hidden).split()
    assert "--overlap-moe-expert-parallel-comm" not in megatron_config(plan).split()
    dualpipe = dataclasses.replace(hidden, schedule="dualpipe-v")
    assert "pipeline_parallel_expert_parallel_overlap" not in torchtitan_toml(dualpipe)  # torchtitan's default: on
    assert "pipeline_parallel_expert_parallel_overlap = false" in torchtitan_toml(
        dataclasses.replace(dualpipe, overlap=plan.overlap)
    )
