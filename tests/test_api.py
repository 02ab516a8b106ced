"""``autopipe.plan``/``profile``/``emit`` from Python: from a model file (a complete recipe that
the command line rebuilds) or from an in-memory module (with its loss and targets)."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from autopipe.cli.main import main
from torch import nn

import autopipe
from autopipe.errors import EmitError, ModelLoadError, PlanError
from autopipe.plans import Plan
from autopipe.stages.merge import merge_state_dict
from autopipe.stages.rebuild import rebuild_model
from tests.helpers import FIXTURES, max_diff, reference_training

torch.set_num_threads(1)

MLP_FILE = str(FIXTURES / "good_mlp.py")
KWARGS = {"width": 8, "depth": 3}
QUICK = {"repeat": 1, "warmup": 0}  # profiling options: the plan's quality is not under test here
_loads = itertools.count()  # a fresh module name for every emitted stage package loaded


def _file_plan() -> Plan:
    return autopipe.plan(MLP_FILE, kwargs=KWARGS, stages=2, batch_size=8, memory="1GiB", **QUICK)


@pytest.fixture(scope="module")
def file_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("api") / "plan.json"
    _file_plan().save(path)
    return path


def _loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, targets)


def _module(seed: int = 7) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


def _emitted_output(folder: Path, x: torch.Tensor) -> torch.Tensor:
    """Chain the emitted stages by the manifest, as the README shows."""
    import importlib.util
    import sys

    manifest = json.loads((folder / "manifest.json").read_text())
    values: dict[str, Any] = {manifest["inputs"][0]["name"]: x}
    for st in manifest["stages"]:
        name = st["package"]
        spec = importlib.util.spec_from_file_location(
            f"_api_stage_{next(_loads)}", folder / name / "__init__.py", submodule_search_locations=[str(folder / name)]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = package
        spec.loader.exec_module(package)
        stage = package.load().eval()
        outs = stage(*[values[i["name"]] for i in st["inputs"]])
        values.update(zip([o["name"] for o in st["outputs"]], outs, strict=True))
    out: torch.Tensor = values[manifest["outputs"][0]["name"]]
    return out


# ----------------------------------------------------------------------------- from a model file


def test_plan_from_a_model_file_records_what_rebuilds_it(file_plan: Path) -> None:
    plan = Plan.load(file_plan)
    recipe = plan.recipe
    assert (recipe.model_file, recipe.factory, recipe.model_kwargs) == (MLP_FILE, "build_model", ("width=8", "depth=3"))
    assert plan.model == f"{MLP_FILE}:build_model -k width=8 -k depth=3"
    rebuilt = rebuild_model(plan)
    assert len(rebuilt.model.layers) == 3 and rebuilt.model.head.in_features == 8  # the kwargs, not the defaults


def test_a_factory_named_as_on_the_command_line() -> None:
    prof = autopipe.profile(f"{MLP_FILE}:build_shallow", kwargs={"width": 4}, micro_batch_sizes=(2,), **QUICK)
    assert (prof.recipe.factory, prof.recipe.model_kwargs) == ("build_shallow", ("width=4",))
    assert prof.model.endswith("good_mlp.py:build_shallow -k width=4")


def test_cli_emits_an_api_plan_of_a_model_file(file_plan: Path, tmp_path: Path) -> None:
    assert main(["emit", str(file_plan), "-o", str(tmp_path / "stages")]) == 0
    plan = Plan.load(file_plan)
    expected = rebuild_model(plan).model.eval()  # seeded as emit seeds it
    x = torch.randn(plan.micro_batch_size, 8)
    with torch.no_grad():
        assert torch.allclose(_emitted_output(tmp_path / "stages", x), expected(x), atol=1e-6)
    assert max_diff(merge_state_dict(tmp_path / "stages"), expected.state_dict()) == 0.0


@pytest.mark.slow
def test_cli_runs_an_api_plan_of_a_model_file_as_unsplit_training(file_plan: Path, tmp_path: Path) -> None:
    steps, lr = 3, 0.1
    code = main(["run", str(file_plan), "--steps", str(steps), "--optimizer", "SGD", "--lr", str(lr), "--timeout", "60",
                 "--save-checkpoint", str(tmp_path / "ckpt")])  # fmt: skip
    assert code == 0
    from autopipe.runtime import assemble_state_dict

    _, reference = reference_training(MLP_FILE, KWARGS, steps=steps, batch_size=8, lr=lr)
    assert max_diff(assemble_state_dict(tmp_path / "ckpt"), reference) <= 1e-5


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"example_inputs": torch.zeros(8, 8)}, "example_inputs comes from the model file"),
        ({"loss_fn": _loss}, "loss_fn comes from the model file"),
        ({"kwargs": {"width": object()}}, "kwargs['width'] is a object, which a plan cannot record"),
        ({"kwargs": {"widht": 8}}, "build_model() does not take widht"),
    ],
)
def test_bad_model_file_calls_say_what_to_do(call: dict[str, Any], message: str) -> None:
    example = call.pop("example_inputs", None)
    with pytest.raises((PlanError, ModelLoadError)) as info:
        autopipe.plan(MLP_FILE, example, stages=2, batch_size=8, **call)
    assert message in str(info.value) and "\n" not in str(info.value)


# ----------------------------------------------------------------------------- in-memory modules


def test_in_memory_plan_profiles_the_loss_on_the_targets_and_names_no_file() -> None:
    seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.append((tuple(output.shape), tuple(targets.shape)))
        return _loss(output, targets)

    asked: list[int] = []

    def targets(batch_size: int) -> torch.Tensor:
        asked.append(batch_size)
        return torch.arange(batch_size) % 3

    x = torch.randn(8, 6)
    plan = autopipe.plan(
        _module(), x, loss_fn=loss, example_targets=targets, stages=2, batch_size=8, memory="1GiB",
        micro_batch_sizes=(2, 4), **QUICK,
    )  # fmt: skip
    assert {2, 4} <= set(asked)
    assert {((2, 3), (2,)), ((4, 3), (4,))} <= set(seen)  # the loss ran on each micro-batch size's targets
    assert plan.recipe.model_file == "" and plan.recipe.factory == "Sequential" and plan.model == "Sequential (in memory)"


def test_the_loss_is_priced_on_the_last_block() -> None:
    def slow_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        time.sleep(0.03)
        return _loss(output, targets)

    prof = autopipe.profile(_module(), torch.randn(4, 6), loss_fn=slow_loss, example_targets=torch.arange(4) % 3,
                            micro_batch_sizes=(2, 4), **QUICK)  # fmt: skip
    forwards = [b.forward_s(2) for b in prof.blocks]
    assert forwards[-1] >= 0.03 and max(forwards[:-1]) < 0.03, forwards


def test_in_memory_targets_as_one_batch_are_sliced() -> None:
    shapes: list[int] = []

    def loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        shapes.append(targets.shape[0])
        return _loss(output, targets)

    autopipe.profile(_module(), torch.randn(4, 6), loss_fn=loss, example_targets=torch.arange(4) % 3,
                     micro_batch_sizes=(1, 2), **QUICK)  # fmt: skip
    assert {1, 2} <= set(shapes)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        ({}, PlanError, "example_inputs are needed to trace the Sequential module"),
        ({"x": torch.randn(8, 6), "kwargs": {"a": 1}}, PlanError, "kwargs are for a model file's factory"),
        ({"x": torch.randn(2, 6)}, PlanError, "example_inputs holds 2 samples but micro-batch size 4 was asked"),
        ({"x": torch.randn(8, 6), "example_targets": torch.zeros(2, dtype=torch.long), "loss_fn": _loss},
         PlanError, "example_targets holds 2 samples"),
        ({"x": torch.randn(8, 6), "loss_fn": lambda o, t: 1 / 0}, ModelLoadError, "loss_fn raised ZeroDivisionError"),
        ({"x": torch.randn(8, 6), "loss_fn": lambda o, t: 1.5}, ModelLoadError, "loss_fn returned a float, not a Tensor"),
        ({"x": torch.randn(8, 6), "loss_fn": "mse"}, PlanError, "loss_fn must be a function"),
    ],
)  # fmt: skip
def test_bad_in_memory_calls_say_what_to_do(call: dict[str, Any], error: type[Exception], message: str) -> None:
    x = call.pop("x", None)
    with pytest.raises(error) as info:
        autopipe.profile(_module(), x, micro_batch_sizes=(2, 4), **QUICK, **call)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_model_must_be_a_module_or_a_file() -> None:
    with pytest.raises(PlanError, match=r"model must be an nn\.Module or a model file path"):
        autopipe.plan(42, batch_size=8)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def memory_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nn.Module, torch.Tensor]:
    model, x = _module(), torch.randn(8, 6)
    plan = autopipe.plan(model, x, loss_fn=_loss, example_targets=torch.arange(8) % 3, stages=2, batch_size=8,
                         memory="1GiB", micro_batch_sizes=(2, 4), **QUICK)  # fmt: skip
    path = tmp_path_factory.mktemp("api") / "memory.json"
    plan.save(path)
    return path, model, x


def test_emit_an_in_memory_module_with_its_own_weights(memory_plan: tuple[Path, nn.Module, torch.Tensor], tmp_path: Path) -> None:
    path, model, x = memory_plan
    plan = Plan.load(path)
    manifest = autopipe.emit(plan, model, tmp_path / "stages", example_inputs=x)
    assert len(manifest["stages"]) == plan.devices * plan.virtual and manifest["model_file"] == ""
    assert max_diff(merge_state_dict(tmp_path / "stages"), model.state_dict()) == 0.0  # not re-seeded
    with torch.no_grad():
        assert torch.allclose(_emitted_output(tmp_path / "stages", x[:3]), model(x[:3]), atol=1e-6)


def test_emit_from_python_refuses_what_it_cannot_do(memory_plan: tuple[Path, nn.Module, torch.Tensor], tmp_path: Path) -> None:
    path, model, x = memory_plan
    plan = Plan.load(path)
    with pytest.raises(PlanError, match=r"needs example_inputs .* micro-batch size"):
        autopipe.emit(plan, model, tmp_path / "a")
    with pytest.raises(PlanError, match="in-memory Sequential module"):
        autopipe.emit(plan, None, tmp_path / "b")
    with torch.device("meta"):
        meta = _module()
    with pytest.raises(PlanError, match="on the meta device, so it has no weights to write; pass weights=False"):
        autopipe.emit(plan, meta, tmp_path / "d", example_inputs=x)
    with pytest.raises(PlanError, match="the plan was made for another model"):
        autopipe.emit(plan, _module().append(nn.ReLU()), tmp_path / "c", example_inputs=x)
    assert not any(tmp_path.iterdir())  # nothing half-written
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(EmitError, match="full is not empty; emit into a new folder or pass force=True"):
        autopipe.emit(plan, model, tmp_path / "full", example_inputs=x)
    autopipe.emit(plan, model, tmp_path / "full", example_inputs=x, force=True)
    assert (tmp_path / "full" / "manifest.json").is_file() and not (tmp_path / "full" / "keep.txt").exists()


def test_emit_from_python_rebuilds_a_model_file_plan(file_plan: Path, tmp_path: Path) -> None:
    manifest = autopipe.emit(Plan.load(file_plan), None, tmp_path / "stages")
    assert manifest["model_kwargs"] == ["width=8", "depth=3"]


@pytest.mark.parametrize("command", ["run", "emit"])
def test_cli_says_how_to_use_an_in_memory_plan(
    memory_plan: tuple[Path, nn.Module, torch.Tensor], tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = memory_plan[0]
    argv = [command, str(path), *(["-o", str(tmp_path / "out")] if command == "emit" else ["--steps", "1"])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in-memory Sequential module" in err
    assert "autopipe.pipeline(plan, model)" in err and "autopipe.emit(plan, model, folder" in err
    assert "pass -k" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_in_memory_plan_trains_in_your_own_loop_as_the_unsplit_module() -> None:
    import copy
    import threading

    pipeline = pytest.importorskip("autopipe.runtime.pipeline").pipeline  # the per-rank training API
    from autopipe.runtime.comm import ThreadHub

    model, x = _module(), torch.randn(8, 6)
    plan = autopipe.plan(model, x, loss_fn=_loss, example_targets=torch.arange(8) % 3, stages=2, batch_size=8,
                         memory="1GiB", choices=autopipe.Choices(micro_batches=4, schedule="1f1b"), micro_batch_sizes=(2,), **QUICK)  # fmt: skip
    hub = ThreadHub(2, 30.0)
    pipes = [pipeline(plan, copy.deepcopy(model), rank=r, comm=lambda _, r=r: hub.comm(r), device="cpu",
                      example_inputs=x[:2], loss_fn=_loss) for r in range(2)]  # fmt: skip
    torch.manual_seed(1)
    batches = [(torch.randn(8, 6), torch.randint(0, 3, (8,))) for _ in range(3)]
    losses: dict[int, list[float]] = {}

    def work(rank: int) -> None:
        opt = torch.optim.SGD(pipes[rank].parameters(), lr=0.1)
        losses[rank] = []
        for bx, by in batches:  # the first rank feeds the inputs, the last the targets
            losses[rank].append(pipes[rank].step(bx if rank == 0 else None, by if rank == 1 else None))
            opt.step()
            opt.zero_grad()

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    expected = []
    for bx, by in batches:
        loss = _loss(reference(bx), by)
        loss.backward()
        opt.step()
        opt.zero_grad()
        expected.append(loss.item())
    assert max(abs(a - b) for a, b in zip(losses[1], expected, strict=True)) <= 1e-5
