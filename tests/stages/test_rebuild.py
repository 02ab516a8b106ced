"""Rebuilding a plan's model from its recipe, and what ``run``/``emit`` say when they cannot:
never a flag those commands do not have (neither takes ``-k``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

from autopipe.errors import PlanError, PlanFileError
from autopipe.plans import Plan
from autopipe.stages.rebuild import check_rebuildable, rebuild_model
from tests.helpers import FIXTURES, even_plan

MLP = str(FIXTURES / "good_mlp.py")


@pytest.fixture(scope="module")
def plan() -> Plan:
    return even_plan(MLP, {"width": 8})


def _with(plan: Plan, **recipe: object) -> Plan:
    return dataclasses.replace(plan, recipe=dataclasses.replace(plan.recipe, **recipe))  # type: ignore[arg-type]


def test_rebuilds_with_the_recorded_kwargs_seeded(plan: Plan) -> None:
    a, b = rebuild_model(plan), rebuild_model(plan)
    assert a.model.head.in_features == 8
    assert all(
        torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True)
    )
    assert all(p.is_meta for p in rebuild_model(plan, meta=True).model.parameters())


def _one_line_error(plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``autopipe emit`` on ``plan``: exit code 2 and one line, which is returned."""
    plan.save(tmp_path / "plan.json")
    assert main(["emit", str(tmp_path / "plan.json"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not (tmp_path / "out").exists()
    assert " -k " not in err.split("autopipe plan", 1)[0]  # -k only ever advised for autopipe plan
    return err


@pytest.mark.parametrize("model_file", ["", "<model>"])
def test_a_plan_of_an_in_memory_module_says_how_to_use_it(
    plan: Plan, model_file: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mem = _with(plan, model_file=model_file, factory="MLP", model_kwargs=())
    with pytest.raises(PlanError, match="from an in-memory MLP module"):
        check_rebuildable(mem)
    err = _one_line_error(mem, tmp_path, capsys)
    assert "autopipe.pipeline(plan, model)" in err and "autopipe.emit(plan, model, folder" in err


def test_an_older_in_memory_plan_naming_a_class_without_kwargs(
    plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # autopipe.plan(model, ...) used to record the module's class and file, without kwargs
    old = _with(plan, factory="MLP", model_kwargs=())
    check_rebuildable(old)  # nothing to tell without importing the file
    err = _one_line_error(old, tmp_path, capsys)
    assert "from an in-memory MLP module" in err and "needs width" not in err


def test_a_kwarg_the_factory_no_longer_takes(plan: Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_error(_with(plan, model_kwargs=("widht=8",)), tmp_path, capsys)
    assert "build_model() in" in err and "does not take widht, which the plan records" in err
    assert f"plan it again: autopipe plan {MLP}:build_model" in err and "did you mean" not in err


def test_a_kwarg_the_factory_now_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = (FIXTURES / "good_mlp.py").read_text()
    (tmp_path / "m.py").write_text(source)
    plan = even_plan(str(tmp_path / "m.py"))
    (tmp_path / "m.py").write_text(
        source.replace("def build_model(width: int = 16,", "def build_model(width: int, scale: int,")
    )
    err = _one_line_error(plan, tmp_path, capsys)
    assert "build_model() in" in err and "needs width, scale, which the plan does not record" in err
    assert err.rstrip().endswith(
        f"plan it again: autopipe plan {tmp_path / 'm.py'}:build_model -k width=VALUE -k scale=VALUE"
    )


@pytest.mark.parametrize(
    ("recipe", "message"),
    [
        ({"model_kwargs": ("width",)}, "the plan's model kwarg 'width' is not key=value"),
        ({"model_kwargs": ("1x=2",)}, "the plan's model kwarg '1x=2' is not key=value"),
        ({"model_kwargs": ("width=2", "width=3")}, "the plan's model kwarg 'width=3' is given twice"),
        ({"factory": "build model"}, "the plan's factory 'build model' is not a Python function name"),
    ],
)
def test_a_damaged_recipe(
    plan: Plan, recipe: dict[str, object], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(PlanFileError, match=message):
        rebuild_model(_with(plan, **recipe))
    assert message in _one_line_error(_with(plan, **recipe), tmp_path, capsys)


def test_a_model_that_no_longer_traces_is_told_to_plan_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run/emit have no --leaf: tracing advice is for autopipe plan, and the message says so."""
    model = tmp_path / "net.py"
    model.write_text((FIXTURES / "control_flow.py").read_text().replace("if x.sum() > 0:", "if True:"))
    plan = even_plan(str(model), stages=2)
    plan.save(tmp_path / "plan.json")
    model.write_text((FIXTURES / "control_flow.py").read_text())  # changed since: no tracer follows it now
    assert main(["emit", str(tmp_path / "plan.json"), "-o", str(tmp_path / "stages")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("autopipe: error: the model no longer traces as it did when planned: ") and err.count("\n") == 1
    )
    assert err.rstrip().endswith(f"when it is fixed, plan again with 'autopipe plan {model}'")
