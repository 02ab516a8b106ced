"""Reading a plan file checks every field: one line naming the field, never a KeyError later."""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from autopipe.cli.main import main

from autopipe.errors import PlanError, PlanFileError
from autopipe.modes import Sharding
from autopipe.plans import MAX_MICRO_BATCHES, FreePlan, Overlap, Plan
from tests.helpers import FIXTURES

PLAN_V1 = FIXTURES / "good_mlp_plan_v1.json"
Mutation = Callable[[dict[str, Any]], None]
_FREE = {
    "schedule": "zb-h1",
    "virtual": 1,
    "micro_batches": 1,
    "recomputed": [],
    "iteration_time_s": 0.5,
    "step_time_s": 0.5,
    "tensor_parallel": 1,
    "devices": 2,
    "data_parallel": 1,
}


def _v2() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(Plan.load(PLAN_V1).to_json())
    return raw


def _set(key: str, value: Any, stage: int | None = None) -> Mutation:
    def mutate(d: dict[str, Any]) -> None:
        (d if stage is None else d["stages"][stage])[key] = value

    return mutate


def _delete(key: str) -> Mutation:
    return lambda d: d.pop(key)


def _extra_stage(d: dict[str, Any]) -> None:
    st = copy.deepcopy(d["stages"][1])
    d["stages"].append({**st, "index": 2, "rank": 2})
    d["devices"] = 3
    d["peak_memory_bytes"].append(1.0)


BAD: list[tuple[str, Mutation, str]] = [
    ("version string", _set("version", "1"), "has plan version '1', this autopipe reads versions 1 and 2 (a number)"),
    ("version bool", _set("version", True), "has plan version True"),
    ("devices string", _set("devices", "2"), "devices is '2', expected a whole number"),
    ("devices bool", _set("devices", True), "devices is True, expected a whole number"),
    ("devices 3 for 2 stages", _set("devices", 3), "the plan has 2 stage(s) but devices 3 x virtual 1 = 3"),
    ("devices 1 for 2 stages", _set("devices", 1), "the plan has 2 stage(s) but devices 1 x virtual 1 = 1"),
    ("recompute yes", _set("recompute", "yes", 0), "stages[0].recompute is 'yes', expected true or false"),
    ("negative time", _set("forward_s", -0.5, 1), "stages[1].forward_s is -0.5, expected a finite number >= 0"),
    ("nan bytes", _set("memory_bytes", math.nan, 0), "stages[0].memory_bytes is nan, expected a finite number"),
    ("inf time", _set("iteration_time_s", math.inf), "iteration_time_s is inf, expected a finite number"),
    ("time string", _set("backward_s", "1ms", 0), "stages[0].backward_s is '1ms', expected a finite number"),
    ("huge int as float", _set("forward_s", 10**400, 0), "stages[0].forward_s is 1000000000000"),
    ("batch 0", _set("batch_size", 0), "batch_size is 0, expected 1 to"),
    ("batch negative", _set("batch_size", -8), "batch_size is -8, expected 1 to 2147483648"),
    ("micro-batches 0", _set("micro_batches", 0), "micro_batches is 0, expected 1 to 65536"),
    (
        "micro-batches not dividing",
        _set("micro_batches", 3),
        "batch_size 8 is not micro_batches 3 x micro_batch_size 8",
    ),
    (
        "micro-batches huge",
        _set("micro_batches", 10**6),
        f"micro_batches is 1000000, expected 1 to {MAX_MICRO_BATCHES}",
    ),
    (
        "schedule unknown",
        _set("schedule", "nope"),
        "schedule 'nope' is unknown "
        "(known: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-v, v-half, v-min, dualpipe-v)",
    ),
    ("virtual 0", _set("virtual", 0), "virtual is 0, expected 1 to 64"),
    (
        "dualpipe-v m < 2S",
        _set("schedule", "dualpipe-v"),
        "micro_batches is 1, but dualpipe-v on 2 devices runs at least 4",
    ),
    ("virtual for 1f1b", _set("virtual", 2), "virtual is 2, but the 1f1b schedule runs one stage per device"),
    ("rank beyond devices", _set("rank", 5, 1), "stage 1 is on device 5, but the 1f1b schedule runs it on device 1"),
    ("rank negative", _set("rank", -1, 1), "stages[1].rank is -1, expected a whole number from 0"),
    ("stage index", _set("index", 7, 1), "stages[1] has index 7, expected 1"),
    ("no stages", _set("stages", []), "the plan has 0 stage(s) but devices 2"),
    ("stages an object", _set("stages", {}), "stages is an object, expected a list"),
    ("an extra stage", _extra_stage, "stage 2 holds block 2 again"),
    ("a stage without blocks", _set("blocks", [], 1), "stage 1 has 0 block(s), 1 block index(es)"),
    ("missing key", _delete("schedule"), "schedule is missing"),
    ("missing recipe", _delete("recipe"), "recipe is missing"),
    ("unknown key", _set("colour", "red"), "'colour' is not a field of a plan"),
    (
        "tracer",
        lambda d: d["recipe"].update(tracer="magic"),
        "recipe.tracer is 'magic', expected one of auto, fx, export",
    ),
    (
        "kwargs not strings",
        lambda d: d["recipe"].update(model_kwargs=[3]),
        "recipe.model_kwargs[0] is 3, expected a string",
    ),
    ("lone surrogate", _set("model", "x\udcff"), "model is 'x\\udcff', expected text"),
    ("peak per device", _set("peak_memory_bytes", []), "peak_memory_bytes has 0 value(s), expected one per device (2)"),
    (
        "a baseline without peaks",
        lambda d: d["baselines"][0].update(peak_memory_bytes=[]),
        "baselines[0].peak_memory_bytes is empty",
    ),
    ("tensor parallel 0", _set("tensor_parallel", 0), "tensor_parallel is 0, expected 1 to 1024"),
    ("tensor parallel negative", _set("tensor_parallel", -3), "tensor_parallel is -3, expected 1 to 1024"),
    ("devices huge", _set("devices", 2**60), "devices is 1152921504606846976, expected 1 to 4096"),
    ("sequence parallel alone", _set("sequence_parallel", True), "sequence_parallel is true with tensor_parallel 1"),
    ("hardware below model flops", _set("model_flops", 5.0), "hardware_flops 0 is below model_flops 5"),
    (
        "target unknown",
        _set("target", "nemo"),
        "target 'nemo' is unknown (known: autopipe, megatron, torchtitan, torch)",
    ),
    ("expert parallel 0", _set("expert_parallel", 0), "expert_parallel is 0, expected 1 to 4096"),
    ("context parallel string", _set("context_parallel", "2"), "context_parallel is '2', expected a whole number"),
    (
        "experts beyond the stage",
        _set("expert_parallel", 2),
        "expert_parallel 2 x expert_tensor_parallel 1 does not divide a stage's tensor_parallel x "
        "context_parallel x data_parallel = 1 devices",
    ),
    ("free plan a list", _set("free_plan", []), "free_plan is a list, expected an object"),
    (
        "free plan missing a field",
        _set("free_plan", {"schedule": "1f1b"}),
        "free_plan.virtual is missing",
    ),
    (
        "free plan schedule unknown",
        _set("free_plan", dict(_FREE, schedule="nope")),
        "free_plan.schedule 'nope' is unknown",
    ),
    ("sharding unknown", _set("sharding", "zero4"), "sharding is 'zero4', expected one of none, zero1, zero2"),
    (
        "sharding without its flag",
        lambda d: d.update(sharding="zero2", data_parallel=2),
        "shard_optimizer is false with sharding zero2",
    ),
    (
        "sharding one replica",
        lambda d: d.update(sharding="zero1", shard_optimizer=True),
        "sharding is zero1 with data_parallel 1",
    ),
    (
        "shard group not a divisor",
        lambda d: d.update(sharding="zero3", shard_optimizer=True, data_parallel=4, shard_group=3),
        "shard_group is 3 with sharding zero3 and data_parallel 4",
    ),
    ("overlap a list", _set("overlap", []), "overlap is a list, expected an object"),
    ("overlap unknown", _set("overlap", {"grad_reduce": True, "magic": 1}), "overlap.'magic' is not a field"),
    ("overlap share", _set("overlap", {"tp_comm": 1.5}), "overlap.tp_comm is 1.5, expected a share from 0 to 1"),
    ("overlap not a bool", _set("overlap", {"p2p": "yes"}), "overlap.p2p is 'yes', expected true or false"),
    (
        "recompute module unknown",
        _set("recompute_modules", ["core_attn", "qkv"]),
        "recompute_modules ['core_attn', 'qkv'] names 'qkv' (known: core_attn, layernorm, mla_up_proj, mlp, mlp_act)",
    ),
    ("recompute modules a string", _set("recompute_modules", "mlp"), "recompute_modules is 'mlp', expected a list"),
    (
        "offload module twice",
        _set("offload_modules", ["core_attn"] * 2),
        "offload_modules ['core_attn', 'core_attn'] names a kind twice",
    ),
    ("recompute layers negative", _set("recompute_layers", -1), "recompute_layers is -1, expected a whole number"),
    (
        "two memory choices",
        lambda d: d.update(recompute_modules=["mlp"], recompute_layers=2),
        "recompute_modules and recompute_layers are both given; a plan makes one uniform memory choice",
    ),
    (
        "a memory choice beside whole stages",
        lambda d: (d.update(offload_modules=["core_attn"]), d["stages"][0].update(recompute=True)),
        "offload_modules is given and stages recompute whole too",
    ),
    ("transient without layers", _set("transient_bytes", 5.0, 0), "stages hold transient_bytes"),
]


@pytest.mark.parametrize(("mutate", "message"), [pytest.param(m, msg, id=name) for name, m, msg in BAD])
def test_a_bad_plan_is_one_line_naming_the_field(mutate: Mutation, message: str) -> None:
    raw = _v2()
    mutate(raw)
    with pytest.raises(PlanFileError) as e:
        Plan.from_json(json.dumps(raw), source="p.json")
    text = str(e.value)
    assert message in text and "\n" not in text
    assert text.startswith("p.json")


def test_good_plans_of_both_versions_load_and_round_trip() -> None:
    plan = Plan.load(PLAN_V1)
    assert Plan.from_json(plan.to_json()) == plan
    raw = _v2()
    del raw["data_parallel"], raw["parallel_note"]  # fields with defaults may be missing
    raw["stages"][0]["forward_s"] = 1  # an int where a float is expected
    again = Plan.from_json(json.dumps(raw))
    assert again.data_parallel == 1 and again.stages[0].forward_s == 1.0
    assert (again.tensor_parallel, again.sequence_parallel, again.model_flops) == (
        1,
        False,
        0.0,
    )  # before tensor parallelism


def test_a_plan_keeps_its_target_and_the_free_plan_and_older_plans_read_as_autopipe() -> None:
    raw = _v2()
    del raw["target"], raw["free_plan"]  # a plan written before --target
    old = Plan.from_json(json.dumps(raw))
    assert old.target == "autopipe" and old.free_plan is None and old == Plan.load(PLAN_V1)
    raw.update(target="megatron", free_plan=_FREE)
    plan = Plan.from_json(json.dumps(raw))
    assert plan.target == "megatron" and plan.free_plan == FreePlan("zb-h1", 1, 1, (), 0.5, 0.5, 1, 2, 1)
    assert Plan.from_json(plan.to_json()) == plan
    assert json.loads(plan.to_json())["free_plan"]["recomputed"] == []


def test_a_memory_choice_is_kept_and_left_out_of_the_file_at_none() -> None:
    plain = Plan.load(PLAN_V1)
    raw = json.loads(plain.to_json())
    assert not {"recompute_modules", "recompute_layers", "offload_modules"} & set(raw)
    assert not any("transient_bytes" in s for s in raw["stages"]) and plain.memory_choice == ""
    raw.update(recompute_modules=["core_attn", "mlp"])
    selective = Plan.from_json(json.dumps(raw))
    assert selective.recompute_modules == ("core_attn", "mlp")
    assert selective.memory_choice == "recompute core_attn+mlp" and "every layer: recompute" in selective.summary()
    assert Plan.from_json(selective.to_json()) == selective
    del raw["recompute_modules"]
    raw.update(recompute_layers=2)
    raw["stages"][0]["transient_bytes"] = 64.0
    block = Plan.from_json(json.dumps(raw))
    assert block.memory_choice == "recompute 2 layers per stage" and block.stages[0].transient_bytes == 64.0
    assert Plan.from_json(block.to_json()) == block


def test_expert_and_context_parallel_fields_are_written_only_when_used() -> None:
    plan = Plan.load(PLAN_V1)
    assert (plan.expert_parallel, plan.expert_tensor_parallel, plan.context_parallel) == (1, 1, 1)
    assert not {"expert_parallel", "expert_tensor_parallel", "context_parallel"} & set(json.loads(plan.to_json()))
    raw = _v2()
    raw.update(data_parallel=4, context_parallel=2, expert_parallel=8)  # a stage of 1 x 2 x 4 devices, EP 8
    used = Plan.from_json(json.dumps(raw))
    assert (used.expert_parallel, used.context_parallel) == (8, 2) and Plan.from_json(used.to_json()) == used


def test_huge_numbers_and_deep_nesting_are_one_line() -> None:
    with pytest.raises(PlanFileError, match="is not a plan"):
        Plan.from_json('{"version": 2, "devices": ' + "9" * 5000 + "}")
    with pytest.raises(PlanFileError, match="is not a plan"):
        Plan.from_json("[" * 100_000 + "]" * 100_000)


def test_plan_files_that_are_not_text_or_not_files(tmp_path: Path) -> None:
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PlanFileError, match="not UTF-8 text"):
        Plan.load(binary)
    with pytest.raises(PlanFileError, match=r"is a directory, not a plan; give a plan written by 'autopipe plan'$"):
        Plan.load(tmp_path)


def test_show_emit_and_run_refuse_a_bad_plan_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = _v2()
    raw["stages"][0]["recompute"] = "yes"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    for argv in (
        ["show", str(path)],
        ["emit", str(path), "-o", str(tmp_path / "out")],
        ["run", str(path), "--timeout", "5"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "stages[0].recompute is 'yes'" in err, argv
    assert not (tmp_path / "out").exists()


def test_sharding_and_overlap_fields_are_left_out_at_their_defaults_and_old_zero1_reads_as_zero1() -> None:
    raw = _v2()
    assert not {"sharding", "shard_group", "overlap", "dp_comm_s"} & set(raw)  # written as before
    old = Plan.from_json(json.dumps(raw))
    assert (old.sharding, old.shard_group, old.overlap) == ("none", 0, Overlap())
    raw.update(data_parallel=2, shard_optimizer=True)  # a ZeRO-1 plan written before the sharding field
    assert Plan.from_json(json.dumps(raw)).sharding == Sharding.ZERO1
    raw.update(
        data_parallel=4,
        sharding="zero3-step",
        shard_group=2,
        overlap={"grad_reduce": True, "tp_comm": 0.5},
        dp_comm_s=2,
    )
    plan = Plan.from_json(json.dumps(raw))
    assert (plan.sharding, plan.shard_group, plan.dp_comm_s) == (Sharding.ZERO3_STEP, 2, 2.0)
    assert plan.overlap == Overlap(grad_reduce=True, tp_comm=0.5)  # p2p left out: its default, on
    assert Plan.from_json(plan.to_json()) == plan and json.loads(plan.to_json())["sharding"] == "zero3-step"


@pytest.mark.parametrize(
    ("text", "overlap"),
    [
        ("none", Overlap(p2p=False)),
        ("p2p", Overlap()),
        ("grad_reduce,param_gather,p2p", Overlap(True, True, 0.0, True)),
        ("tp_comm=0.25", Overlap(tp_comm=0.25, p2p=False)),
    ],
)
def test_overlap_text_reads_and_writes_back(text: str, overlap: Overlap) -> None:
    assert Overlap.parse(text) == overlap and Overlap.parse(overlap.text()) == overlap


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("magic", "overlap 'magic': 'magic' is not an overlap; use none, or any of grad_reduce"),
        ("tp_comm=2", "overlap 'tp_comm=2': tp_comm=2 is not a share from 0 to 1"),
        ("tp_comm=x", "tp_comm=x is not a share from 0 to 1"),
        ("p2p=1", "'p2p=1' is not an overlap"),
    ],
)
def test_bad_overlap_text_is_one_line(text: str, message: str) -> None:
    with pytest.raises(PlanError, match=re.escape(message)):
        Overlap.parse(text)
