"""A plan checked against its rebuilt model: which stage differs, and how to plan again."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from autopipe.cli.main import main

from autopipe.errors import PlanError
from autopipe.graph.trace import TracedModel
from autopipe.plans import Plan, StagePlan
from autopipe.runtime.run.worker import rebuild
from autopipe.stages.check import check_plan, replan_hint
from tests.helpers import FIXTURES, even_plan

MLP = str(FIXTURES / "good_mlp.py")


@cache
def _base() -> tuple[Plan, TracedModel]:
    plan = even_plan(MLP, {"depth": 3}, stages=2)
    return plan, rebuild(plan).traced


def _with_stages(plan: Plan, edit: Callable[[list[StagePlan]], None]) -> Plan:
    stages = list(plan.stages)
    edit(stages)
    return dataclasses.replace(plan, stages=tuple(stages))


def _move_node(stages: list[StagePlan]) -> None:  # the first node of stage 1 onto stage 0
    a, b = stages
    stages[0] = dataclasses.replace(a, nodes=(*a.nodes, b.nodes[0]))
    stages[1] = dataclasses.replace(b, nodes=b.nodes[1:])


def _drop_last_node(stages: list[StagePlan]) -> None:
    stages[1] = dataclasses.replace(stages[1], nodes=stages[1].nodes[:-1])


def _rename_node(stages: list[StagePlan]) -> None:
    stages[1] = dataclasses.replace(stages[1], nodes=("nope", *stages[1].nodes[1:]))


def _drop_last_block(stages: list[StagePlan]) -> None:
    st = stages[1]
    cut = len(st.blocks) - 1
    stages[1] = dataclasses.replace(
        st,
        blocks=st.blocks[:cut],
        block_indices=st.block_indices[:cut],
        nodes=tuple(n for n in st.nodes if n not in {"head"}),
    )


def _swap(stages: list[StagePlan]) -> None:
    a, b = stages
    stages[0] = dataclasses.replace(b, index=0, rank=0)
    stages[1] = dataclasses.replace(a, index=1, rank=1)


def _twice(stages: list[StagePlan]) -> None:
    a, b = stages
    stages[1] = dataclasses.replace(
        b, blocks=(a.blocks[-1], *b.blocks), block_indices=(a.block_indices[-1], *b.block_indices)
    )


def _reverse(stages: list[StagePlan]) -> None:
    b = stages[1]
    stages[1] = dataclasses.replace(b, blocks=b.blocks[::-1], block_indices=b.block_indices[::-1])


def _beyond(stages: list[StagePlan]) -> None:
    stages[1] = dataclasses.replace(stages[1], block_indices=(*stages[1].block_indices[:-1], 99))


def _rename_block(stages: list[StagePlan]) -> None:
    stages[0] = dataclasses.replace(stages[0], blocks=("other", *stages[0].blocks[1:]))


CASES = [
    (
        "a stage cut in the middle of a block",
        _move_node,
        "stage 0 has node 'layers_2_0' of block 2 ('layers.2.0'), which is on another stage",
    ),
    ("a node missing", _drop_last_node, "stage 1 lacks node 'head' of its block 3 ('head'): a block cut in the middle"),
    ("an unknown node", _rename_node, "stage 1 has node 'nope', which the model does not have"),
    ("blocks on no stage", _drop_last_block, "1 block(s) of the model are on no stage ('head')"),
    (
        "stages out of order",
        _swap,
        "stage 0 holds block 2 ('layers.2.0'), which reads block 1 ('layers.1.0') of the later stage 1",
    ),
    ("a block twice", _twice, "stage 1 holds block 1 ('layers.1.0'), which stage 0 holds too"),
    ("blocks out of order", _reverse, "stage 1 lists block 2 after block 3: a stage's blocks go in the model's order"),
    ("a block the model lacks", _beyond, "stage 1 holds block 99, but the model has 4 blocks (0 .. 3)"),
    ("a block renamed", _rename_block, "stage 0 calls block 0 'other', but in the model it is 'layers.0.0'"),
]


@pytest.mark.parametrize(("edit", "message"), [pytest.param(e, m, id=name) for name, e, m in CASES])
def test_a_plan_that_does_not_fit_its_model_names_the_stage(
    edit: Callable[[list[StagePlan]], None], message: str
) -> None:
    plan, traced = _base()
    with pytest.raises(PlanError) as e:
        check_plan(_with_stages(plan, edit), traced)
    text = str(e.value)
    assert message in text, text
    assert text.endswith(f"plan again with 'autopipe plan {MLP} -k depth=3'") and "\n" not in text


def test_the_good_plan_passes_and_another_models_plan_does_not() -> None:
    plan, traced = _base()
    check_plan(plan, traced)
    other = dataclasses.replace(plan, recipe=dataclasses.replace(plan.recipe, fingerprint="0123456789abcdef"))
    with pytest.raises(PlanError, match=r"made for another model \(fingerprint 0123456789abcdef, this model traces to"):
        check_plan(other, traced)
    emptied = dataclasses.replace(plan, recipe=dataclasses.replace(plan.recipe, fingerprint=""))
    with pytest.raises(PlanError) as info:  # no identity to check is not a pass
        check_plan(emptied, traced)
    assert str(info.value) == (
        "the plan has no model fingerprint (recipe.fingerprint is empty), so it cannot be checked against the "
        f"model; plan again with 'autopipe plan {MLP} -k depth=3'"
    )


def test_the_hint_stays_on_one_line() -> None:
    plan, _ = _base()
    odd = dataclasses.replace(
        plan, recipe=dataclasses.replace(plan.recipe, model_file="a b\nc.py", model_kwargs=("x='1'",))
    )
    hint = replan_hint(odd)
    assert "\n" not in hint and "a b\\nc.py" in hint and hint.startswith("plan again with ")


def test_a_plan_made_in_python_is_planned_again_in_python() -> None:
    plan, _ = _base()
    for file in ("", "<model>"):  # the model_file of autopipe.plan(model, ...)
        in_memory = dataclasses.replace(plan, recipe=dataclasses.replace(plan.recipe, model_file=file))
        assert replan_hint(in_memory) == "plan again in Python with autopipe.plan(model, example_inputs, ...)"


def _no_rank(*args: object, **kwargs: object) -> None:
    raise AssertionError("a rank was started")


def test_run_and_emit_refuse_a_plan_cut_mid_block_before_any_rank_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, _ = _base()
    path = tmp_path / "p.json"
    path.write_text(_with_stages(plan, _move_node).to_json())
    monkeypatch.setattr(subprocess, "Popen", _no_rank)
    for argv in (["run", str(path), "--timeout", "30"], ["emit", str(path), "-o", str(tmp_path / "out")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "a stage cut in the middle of a block" in err and "rank" not in err, err
    assert not (tmp_path / "out").exists()
    assert json.loads(path.read_text())["stages"][0]["nodes"][-1] == "layers_2_0"


def test_a_tensor_parallel_plan_is_handed_to_megatron_not_run() -> None:
    plan, traced = _base()
    with pytest.raises(PlanError) as info:
        check_plan(dataclasses.replace(plan, tensor_parallel=2), traced)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the plan splits each layer over 2 tensor-parallel devices")
    assert "autopipe config PLAN --for megatron" in message
    assert message.endswith("--tensor-parallel 1")


@pytest.mark.parametrize(
    "fields", [{"expert_parallel": 2, "data_parallel": 2}, {"context_parallel": 2}, {"expert_tensor_parallel": 1}]
)
def test_expert_and_context_parallel_plans_are_handed_to_the_frameworks(fields: dict[str, int]) -> None:
    plan, traced = _base()
    changed = dataclasses.replace(plan, **fields)
    if changed.expert_parallel == changed.context_parallel == 1:  # degree 1 everywhere: runs as before
        check_plan(changed, traced)
        return
    with pytest.raises(PlanError) as info:
        check_plan(changed, traced)
    message = str(info.value)
    assert "\n" not in message and "autopipe config PLAN --for megatron" in message
    assert message.startswith(
        f"the plan shards the experts over {changed.expert_parallel} x 1 expert-parallel devices and the sequence "
        f"over {changed.context_parallel} context-parallel devices, which autopipe's executor and emitted stages "
        "do not do"
    )


def test_to_torch_pipelining_refuses_an_expert_parallel_plan() -> None:
    import torch

    from autopipe.stages.export import to_torch_pipelining
    from tests.fixtures import good_mlp

    plan = dataclasses.replace(even_plan(MLP, {"depth": 3}, stages=2), expert_parallel=2, data_parallel=2)
    with pytest.raises(PlanError, match="the plan shards the experts over 2 x 1 expert-parallel devices"):
        to_torch_pipelining(
            plan, good_mlp.build_model(depth=3), 0, example_inputs=torch.randn(plan.micro_batch_size, 16)
        )


def test_an_analytic_plan_run_in_another_dtype_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An H100 bf16 plan run on this machine's fp32 model: the same model in another precision,
    not 'another model'."""
    assert main(["plan", "models/mlp.py", "--device", "h100", "--stages", "2", "-o", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    plan = Plan.load(tmp_path / "p.json")
    assert plan.precision == "bf16" and even_plan(MLP).precision is None
    with pytest.raises(PlanError) as info:
        rebuild(plan)
    assert str(info.value) == (
        f"the plan was priced for this model in bf16 ({plan.profile_device}), and here it builds in float32: an "
        "analytic plan is for the devices it was counted on (train it there: 'autopipe config PLAN --for megatron' "
        "or '--for torchtitan'); to run it on this machine, plan it here with "
        f"'autopipe plan {Path('models/mlp.py').resolve()}'"  # the plan file records it absolute
    )
    other = dataclasses.replace(plan, recipe=dataclasses.replace(plan.recipe, fingerprint="0123456789abcdef"))
    with pytest.raises(PlanError, match="made for another model"):
        rebuild(other)
