"""autopipe/config/parts.py: a plan's stages in transformer layers, and its degrees."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autopipe.config.parts import degrees, model_parts, plan_precision
from autopipe.errors import ConfigError
from autopipe.plans import Plan

MLP_PLAN = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "good_mlp_plan_v1.json"


def _renamed(*stages: tuple[str, ...]) -> Plan:
    """The two-stage MLP plan of the fixtures with its blocks renamed."""
    plan = Plan.load(MLP_PLAN)
    return dataclasses.replace(
        plan,
        stages=tuple(
            dataclasses.replace(
                s, blocks=names, block_indices=tuple(range(sum(map(len, stages[:i])), sum(map(len, stages[: i + 1]))))
            )
            for i, (s, names) in enumerate(zip(plan.stages, stages, strict=True))
        ),
    )


def test_hugging_face_names_and_merged_blocks() -> None:
    parts = model_parts(
        _renamed(
            ("model.embed_tokens", "model.layers.0", "model.layers.1..model.layers.2"),
            ("model.layers.3", "model.norm", "lm_head"),
        )
    )
    assert parts.container == "model.layers" and parts.num_layers == 4
    assert [c.layers for c in parts.chunks] == [3, 1]
    assert parts.chunks[0].pre == ("model.embed_tokens",) and parts.chunks[1].post == ("model.norm", "lm_head")
    assert parts.notes == () and parts.round_robin
    merged = model_parts(_renamed(("wte..blocks.1",), ("blocks.2..lm_head",)))
    assert [c.layers for c in merged.chunks] == [2, 1] and merged.chunks[0].pre and merged.chunks[1].post


def test_what_cannot_be_placed_is_a_note() -> None:
    split = model_parts(_renamed(("wte", "blocks.0", "blocks.1.attn"), ("blocks.1.mlp", "blocks.2", "head")))
    assert [c.layers for c in split.chunks] == [2, 1]
    assert split.notes == (
        "layer blocks.1 is split between stages 0 and 1 (block blocks.1.mlp); "
        "the frameworks keep a layer whole, on stage 0",
    )
    between = model_parts(_renamed(("wte", "blocks.0", "adapter"), ("blocks.1", "head")))
    assert "blocks adapter (stage 0) sit between transformer layers" in between.notes[0]
    late = model_parts(_renamed(("wte",), ("pos", "blocks.0", "blocks.1", "head")))
    assert [c.layers for c in late.chunks] == [0, 2]
    assert (
        "the embedding part (wte, pos) spans stages 0, 1; the frameworks put it all on the first stage" in late.notes[0]
    )


def test_a_plan_without_layers_and_bad_degrees_are_one_line() -> None:
    with pytest.raises(
        ConfigError, match=r"has no layer list \(no block named like layers.0 or blocks.0; its first block is 'fc1'\)"
    ):
        model_parts(_renamed(("fc1", "relu"), ("fc2",)))
    plan = Plan.load(MLP_PLAN)
    assert degrees(plan).world_size == plan.devices * plan.data_parallel
    assert degrees(plan, tensor_parallel=4).world_size == 4 * plan.devices
    with pytest.raises(ConfigError, match="tensor parallel degree is True"):
        degrees(plan, tensor_parallel=True)


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("h100: NVIDIA H100 SXM (analytic, bf16)", "bf16"),
        ("a100: NVIDIA A100 (analytic, fp16, t=2 with sequence parallelism)", "fp16"),
        ("h100: NVIDIA H100 SXM (analytic, tf32)", "tf32"),
        ("cpu: x86_64, 1 thread", "fp32"),  # measured: the model as it is
    ],
)
def test_the_precision_a_plan_was_priced_in(device: str, expected: str) -> None:
    assert plan_precision(dataclasses.replace(Plan.load(MLP_PLAN), profile_device=device)) == expected
