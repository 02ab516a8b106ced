"""A plan records its model file relative to the plan file's folder (absolute when outside it),
and a plan moved with its model file still finds it: show, emit and run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autopipe.errors import ModelLoadError
from autopipe.graph.model_file import found, recorded
from autopipe.plans import Plan
from autopipe.stages.rebuild import rebuild_model
from tests.helpers import FIXTURES, even_plan

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "autopipe.cli", *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_recorded_relative_under_the_plans_folder_else_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert recorded("A/model.py", "A/plan.json") == "model.py"
    assert recorded("A/sub/model.py", "A/plan.json") == "sub/model.py"
    assert recorded(str(tmp_path / "A" / "m.py"), tmp_path / "A" / "p.json") == "m.py"
    assert recorded("models/m.py", "out/plan.json") == str(tmp_path / "models" / "m.py")
    assert recorded("../m.py", "plan.json") == str(tmp_path.parent / "m.py")
    assert recorded("", "out/plan.json") == "" and recorded("<model>", "p.json") == "<model>"


def test_found_looks_in_the_plans_folder_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "B").mkdir()
    (tmp_path / "B" / "m.py").write_text("")
    (tmp_path / "m.py").write_text("")
    assert found("m.py", "B/plan.json") == "B/m.py"  # beside the plan wins over the current folder
    assert found("other.py", "B/plan.json") == "other.py"  # an older plan: from the current folder
    assert found("/abs/m.py", "B/plan.json") == "/abs/m.py"
    assert found(str(tmp_path / "B" / "m.py"), "B/plan.json") == str(tmp_path / "B" / "m.py")
    assert found("m.py", None) == "m.py" and found("", "B/plan.json") == ""


def test_save_and_load_round_trip_from_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "A"
    folder.mkdir()
    shutil.copy(FIXTURES / "good_mlp.py", folder / "model.py")
    monkeypatch.chdir(tmp_path)
    plan = even_plan("A/model.py")
    plan.save("A/plan.json")
    assert json.loads((folder / "plan.json").read_text())["recipe"]["model_file"] == "model.py"
    assert Plan.load("A/plan.json") == plan  # read back as a path from here
    moved = tmp_path / "elsewhere" / "B"
    shutil.move(str(folder), moved)
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = Plan.load("B/plan.json")
    assert again.recipe.model_file == "B/model.py"
    assert rebuild_model(again).spec.path == Path("B/model.py")
    outside = even_plan(str(FIXTURES / "good_mlp.py"))
    outside.save(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["recipe"]["model_file"] == str(FIXTURES / "good_mlp.py")


def test_an_old_plan_relative_to_where_it_was_planned_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models").mkdir()
    shutil.copy(FIXTURES / "good_mlp.py", tmp_path / "models" / "mlp.py")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    raw = json.loads(even_plan("models/mlp.py").to_json())  # as plans were written: from the current folder
    (tmp_path / "out" / "plan.json").write_text(json.dumps(raw))
    plan = Plan.load("out/plan.json")
    assert plan.recipe.model_file == "models/mlp.py"
    assert rebuild_model(plan, base="out").spec.path == Path("models/mlp.py")
    os.remove("models/mlp.py")
    with pytest.raises(
        ModelLoadError, match=r"^model file not found: models/mlp\.py \(looked in the plan's folder out"
    ):
        rebuild_model(plan, base="out")


@pytest.mark.slow
def test_a_moved_folder_shows_emits_and_runs(tmp_path: Path) -> None:
    a = tmp_path / "A"
    a.mkdir()
    shutil.copy(FIXTURES / "good_mlp.py", a / "model.py")
    made = _cli("plan", "A/model.py", "--stages", "2", "-o", "A/plan.json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert json.loads((a / "plan.json").read_text())["recipe"]["model_file"] == "model.py"
    b = tmp_path / "far" / "B"
    b.parent.mkdir()
    a.rename(b)
    elsewhere = tmp_path / "far"
    shown = _cli("show", "B/plan.json", cwd=elsewhere)
    assert shown.returncode == 0, shown.stderr
    emitted = _cli("emit", str(b / "plan.json"), "-o", str(tmp_path / "stages"), cwd=tmp_path)
    assert emitted.returncode == 0, emitted.stderr
    manifest = json.loads((tmp_path / "stages" / "manifest.json").read_text())
    assert len(manifest["stages"]) == 2
    ran = _cli("run", "B/plan.json", "--steps", "1", cwd=elsewhere)
    assert ran.returncode == 0, ran.stderr
    assert "loss per step:" in ran.stdout
