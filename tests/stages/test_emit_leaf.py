"""Modules kept whole (a ``--leaf`` class, a torch module with submodules) in emitted stages:
built from the model file, weights from the stage's file, outputs equal to the model's."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import autopipe
from autopipe.errors import EmitError
from autopipe.stages.emit import emit, emit_stages
from autopipe.stages.rebuild import rebuild_model
from autopipe.stages.source import ModelFile
from tests.helpers import FIXTURES, even_plan

torch.set_num_threads(1)

MODEL = FIXTURES / "leaf_modules.py"

CHAIN = r"""
import importlib.util, json, os, sys

class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "autopipe":
            raise ImportError("autopipe must not be needed")
        return None

sys.meta_path.insert(0, _Block())
import torch
torch.set_num_threads(1)
root, model_file = sys.argv[1], sys.argv[4] or None
manifest = json.load(open(os.path.join(root, "manifest.json")))
env = {manifest["inputs"][0]["name"]: torch.load(sys.argv[2])}
for st in manifest["stages"]:
    spec = importlib.util.spec_from_file_location(st["package"], os.path.join(root, st["module"]))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    module = (mod.load(model_file=model_file) if hasattr(mod, "MODEL_FILE") else mod.load()).eval()
    with torch.no_grad():
        outs = module(*[env[i["name"]] for i in st["inputs"]])
    env.update(zip([o["name"] for o in st["outputs"]], outs))
torch.save(env[manifest["outputs"][0]["name"]], sys.argv[3])
"""


def _chain(folder: Path, tmp: Path, model_file: str = "") -> subprocess.CompletedProcess[str]:
    torch.save(_x(), tmp / "x.pt")
    script = tmp / "chain.py"
    script.write_text(CHAIN)
    argv = [sys.executable, str(script), str(folder), str(tmp / "x.pt"), str(tmp / "y.pt"), model_file]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp)


def _x() -> torch.Tensor:
    """Three samples: not the plan's micro-batch size."""
    return torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
def test_kept_whole_modules_emit_and_chain_to_the_models_output(tmp_path: Path) -> None:
    # docs/security.md: "An emitted stage imports torch and nothing else, except a stage that keeps"
    plan = even_plan(str(MODEL), ["width=12"], stages=3, leaf_modules=("Gate",))
    manifest = emit(plan, tmp_path / "stages")
    need = manifest["needs_model_file"]
    assert need == {
        "path": str(MODEL.resolve()),
        "factory": "build_model",
        "kwargs": ["width=12"],
        "stages": [1],  # stage 1 holds gate and enc; 0 and 2 need only torch
        "modules": {"gate": "Gate", "enc": "TransformerEncoderLayer"},
    }
    assert json.loads((tmp_path / "stages" / "manifest.json").read_text())["needs_model_file"] == need
    assert all("MODEL_FILE" not in (tmp_path / "stages" / f"stage{j}" / "stage.py").read_text() for j in (0, 2))
    weights = torch.load(tmp_path / "stages" / "stage1" / "weights.pt", weights_only=True)
    assert {"gate.a.weight", "gate.b.bias", "gate.shift"} <= weights.keys()  # the non-persistent buffer too

    proc = _chain(tmp_path / "stages", tmp_path)
    assert proc.returncode == 0, proc.stderr
    model = rebuild_model(plan).model.eval()
    with torch.no_grad():
        want = model(_x())
    got = torch.load(tmp_path / "y.pt")
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5)

    # the model file moved: load(model_file=...) finds it; without it, one clear error
    moved = tmp_path / "elsewhere" / "leaf_modules.py"
    moved.parent.mkdir()
    shutil.copy(MODEL, moved)
    stages = tmp_path / "stages"
    for st in manifest["stages"]:
        text = (stages / st["module"]).read_text()
        (stages / st["module"]).write_text(text.replace(repr(str(MODEL.resolve())), repr(str(tmp_path / "gone.py"))))
    proc = _chain(stages, tmp_path)
    assert proc.returncode != 0
    assert "keeps gate, enc whole, built from the model file" in proc.stderr and "pass model_file=" in proc.stderr
    proc = _chain(stages, tmp_path, str(moved))
    assert proc.returncode == 0, proc.stderr
    assert torch.allclose(torch.load(tmp_path / "y.pt"), want, atol=1e-5, rtol=1e-5)


def test_a_kept_whole_module_without_a_model_file_is_one_line(tmp_path: Path) -> None:
    plan = even_plan(str(MODEL), ["width=12"], stages=3, leaf_modules=("Gate",))
    plan = dataclasses.replace(plan, recipe=dataclasses.replace(plan.recipe, model_file=""))
    loaded = rebuild_model(even_plan(str(MODEL), ["width=12"], stages=3, leaf_modules=("Gate",)))
    with pytest.raises(EmitError, match=r"^module gate \(Gate, a module of the model's own code\) is kept whole") as e:
        emit_stages(plan, loaded.model, loaded.make_inputs(plan.micro_batch_size), tmp_path / "stages")
    assert "--leaf" not in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_a_model_file_that_builds_other_modules_is_refused(tmp_path: Path) -> None:
    plan = even_plan(str(MODEL), ["width=12"], stages=3, leaf_modules=("Gate",))
    other = tmp_path / "other.py"
    other.write_text(MODEL.read_text().replace("self.gate = Gate(width)", "self.gate = nn.Identity()"))
    loaded = rebuild_model(plan)
    with pytest.raises(EmitError, match=r"^stage 1 keeps module gate \(Gate\) whole, built from .*other\.py, whose"):
        emit_stages(
            plan,
            loaded.model,
            loaded.make_inputs(plan.micro_batch_size),
            tmp_path / "stages",
            model_file=ModelFile(str(other), "build_model", ("width=12",)),
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.py"]


def test_without_weights_a_data_dependent_kept_whole_module_says_why_in_one_line(tmp_path: Path) -> None:
    plan = even_plan(str(MODEL), ["width=12"], stages=3, leaf_modules=("Gate",))
    with pytest.raises(EmitError) as info:
        emit(plan, tmp_path / "stages", weights=False)
    message = str(info.value)
    assert message.startswith("without weights the model is built on the meta device, where the modules the plan keeps")
    assert "(Gate)" in message and "leaf_modules.py:18" in message and message.endswith("weights=False)")
    assert "\n" not in message and list(tmp_path.iterdir()) == []


def test_the_api_emits_a_module_it_is_given_with_kept_whole_modules_from_the_plans_file(tmp_path: Path) -> None:
    plan = even_plan(str(MODEL), ["width=12"], stages=3, leaf_modules=("Gate",))
    loaded = rebuild_model(plan, seed=5)
    manifest = autopipe.emit(plan, loaded.model, tmp_path / "stages", example_inputs=loaded.make_inputs)
    assert manifest["needs_model_file"]["path"] == str(MODEL.resolve())
    weights = torch.load(tmp_path / "stages" / "stage1" / "weights.pt", weights_only=True)
    assert torch.equal(weights["gate.a.weight"], loaded.model.get_submodule("gate.a").weight)  # its own weights
