"""autopipe/config/retarget.py: the one ``#`` line a config gets for a plan made for another target."""

from __future__ import annotations

import dataclasses

from autopipe.config import torchtitan_recipe, torchtitan_toml
from autopipe.config.megatron import megatron_args
from autopipe.plans import Plan
from tests.config.test_torchtitan import _gpt_like

_SPLIT = (("wte", "blocks.0"), ("blocks.1",), ("blocks.2", "blocks.3", "ln_f"), ("lm_head",))
_MEGATRON = (
    "'autopipe plan ... --target megatron' plans the best Megatron-LM runs "
    "(1f1b or interleaved-1f1b, every stage recomputed or none, or selective recomputation, the block method or "
    "activation offload)"
)
_TITAN = "'autopipe plan ... --target torchtitan' plans the best torchtitan runs ("


def _lines(text: str, start: str = "# the plan was made with --target") -> list[str]:
    return [line for line in text.splitlines() if line.startswith(start)]


def _some_recomputed(plan: Plan) -> Plan:
    return dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, recompute=s.index == 0) for s in plan.stages))


def test_a_v_half_free_plan_says_what_to_plan_for_each_framework() -> None:
    v_half = _gpt_like(split=_SPLIT, schedule="v-half", virtual=2)
    assert v_half.target == "autopipe"
    text = megatron_args(v_half)
    assert _lines(text) == [
        "# the plan was made with --target autopipe: Megatron-LM does not run its v-half schedule as priced "
        f"(what it runs instead: above); {_MEGATRON}"
    ]
    lines = text.splitlines()
    assert lines.index(_lines(text, "# Megatron has no v-half schedule: it runs interleaved 1F1B")[0]) < lines.index(
        _lines(text)[0]
    )  # what Megatron runs instead, said once, above
    for titan in (torchtitan_recipe(v_half), torchtitan_toml(v_half)):  # torchtitan runs it from a CSV
        assert _lines(titan) == []
        assert "# torch has no v-half schedule class: torchtitan runs the plan's exact order from " in titan
    recomputed = dataclasses.replace(
        v_half, stages=tuple(dataclasses.replace(s, recompute=True) for s in v_half.stages)
    )
    for titan in (torchtitan_recipe(recomputed), torchtitan_toml(recomputed)):  # which cannot say recomputation
        (line,) = _lines(titan)
        assert (
            line.startswith(
                "# the plan was made with --target autopipe: torchtitan does not run its v-half schedule with "
                "recomputation as priced (what it runs instead: above); "
            )
            and _TITAN in line
        ), line


def test_recomputation_on_some_stages_only_is_said_and_a_runnable_plan_gets_no_line() -> None:
    some = _some_recomputed(_gpt_like())
    for text in (megatron_args(some), torchtitan_recipe(some)):
        (line,) = _lines(text)
        assert "does not run recomputation on some stages only as priced" in line
    for plan in (_gpt_like(), _gpt_like(recompute=True), dataclasses.replace(some, target="megatron")):
        assert _lines(megatron_args(plan)) == []
    zb_v = _gpt_like(split=_SPLIT, schedule="zb-v", virtual=2)
    assert _lines(torchtitan_recipe(zb_v)) == []  # torchtitan runs ZB-V (ZBVZeroBubble)
    (line,) = _lines(megatron_args(zb_v))
    assert "Megatron-LM does not run its zb-v schedule as priced" in line
    both = _some_recomputed(zb_v)
    (line,) = _lines(megatron_args(both))
    assert "does not run its zb-v schedule or recomputation on some stages only as priced" in line
