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
from autopipe.units import parse_duration, parse_rate
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
    code = main(
        [
            "run",
            str(file_plan),
            "--steps",
            str(steps),
            "--optimizer",
            "SGD",
            "--lr",
            str(lr),
            "--timeout",
            "60",
            "--save-checkpoint",
            str(tmp_path / "ckpt"),
        ]
    )
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
        _module(),
        x,
        loss_fn=loss,
        example_targets=targets,
        stages=2,
        batch_size=8,
        memory="1GiB",
        micro_batch_sizes=(2, 4),
        **QUICK,
    )
    assert {2, 4} <= set(asked)
    assert {((2, 3), (2,)), ((4, 3), (4,))} <= set(seen)  # the loss ran on each micro-batch size's targets
    assert (
        plan.recipe.model_file == "" and plan.recipe.factory == "Sequential" and plan.model == "Sequential (in memory)"
    )


def test_the_loss_is_priced_on_the_last_block() -> None:
    def slow_loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        time.sleep(0.03)
        return _loss(output, targets)

    prof = autopipe.profile(
        _module(),
        torch.randn(4, 6),
        loss_fn=slow_loss,
        example_targets=torch.arange(4) % 3,
        micro_batch_sizes=(2, 4),
        **QUICK,
    )
    forwards = [b.forward_s(2) for b in prof.blocks]
    assert forwards[-1] >= 0.03 and max(forwards[:-1]) < 0.03, forwards


def test_in_memory_targets_as_one_batch_are_sliced() -> None:
    shapes: list[int] = []

    def loss(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        shapes.append(targets.shape[0])
        return _loss(output, targets)

    autopipe.profile(
        _module(),
        torch.randn(4, 6),
        loss_fn=loss,
        example_targets=torch.arange(4) % 3,
        micro_batch_sizes=(1, 2),
        **QUICK,
    )
    assert {1, 2} <= set(shapes)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        ({}, PlanError, "example_inputs are needed to trace the Sequential module"),
        ({"x": torch.randn(8, 6), "kwargs": {"a": 1}}, PlanError, "kwargs are for a model file's factory"),
        ({"x": torch.randn(2, 6)}, PlanError, "example_inputs holds 2 samples but micro-batch size 4 was asked"),
        (
            {"x": torch.randn(8, 6), "example_targets": torch.zeros(2, dtype=torch.long), "loss_fn": _loss},
            PlanError,
            "example_targets holds 2 samples",
        ),
        ({"x": torch.randn(8, 6), "loss_fn": lambda o, t: 1 / 0}, ModelLoadError, "loss_fn raised ZeroDivisionError"),
        (
            {"x": torch.randn(8, 6), "loss_fn": lambda o, t: 1.5},
            ModelLoadError,
            "loss_fn returned a float, not a Tensor",
        ),
        ({"x": torch.randn(8, 6), "loss_fn": "mse"}, PlanError, "loss_fn must be a function"),
    ],
)
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
    plan = autopipe.plan(
        model,
        x,
        loss_fn=_loss,
        example_targets=torch.arange(8) % 3,
        stages=2,
        batch_size=8,
        memory="1GiB",
        micro_batch_sizes=(2, 4),
        **QUICK,
    )
    path = tmp_path_factory.mktemp("api") / "memory.json"
    plan.save(path)
    return path, model, x


def test_emit_an_in_memory_module_with_its_own_weights(
    memory_plan: tuple[Path, nn.Module, torch.Tensor], tmp_path: Path
) -> None:
    path, model, x = memory_plan
    plan = Plan.load(path)
    manifest = autopipe.emit(plan, model, tmp_path / "stages", example_inputs=x)
    assert len(manifest["stages"]) == plan.devices * plan.virtual and manifest["model_file"] == ""
    assert max_diff(merge_state_dict(tmp_path / "stages"), model.state_dict()) == 0.0  # not re-seeded
    with torch.no_grad():
        assert torch.allclose(_emitted_output(tmp_path / "stages", x[:3]), model(x[:3]), atol=1e-6)


def test_emit_from_python_refuses_what_it_cannot_do(
    memory_plan: tuple[Path, nn.Module, torch.Tensor], tmp_path: Path
) -> None:
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
    plan = autopipe.plan(
        model,
        x,
        loss_fn=_loss,
        example_targets=torch.arange(8) % 3,
        stages=2,
        batch_size=8,
        memory="1GiB",
        choices=autopipe.Choices(micro_batches=4, schedule="1f1b"),
        micro_batch_sizes=(2,),
        **QUICK,
    )
    hub = ThreadHub(2, 30.0)
    pipes = [
        pipeline(
            plan,
            copy.deepcopy(model),
            rank=r,
            comm=lambda _, r=r: hub.comm(r),
            device="cpu",
            example_inputs=x[:2],
            loss_fn=_loss,
        )
        for r in range(2)
    ]
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


# ----------------------------------------------------------------------------- one value per choice


ENTRY_POINTS = {"plan": autopipe.plan, "plan_profile": autopipe.plan_profile, "plan_cluster": autopipe.plan_cluster}
PINNED = autopipe.Choices(micro_batches=4, schedule="1f1b", recompute=autopipe.Recompute.NEVER)
PRICED = autopipe.Link(
    bandwidth=parse_rate("25GB/s"),
    latency_s=parse_duration("20us"),
    action_overhead_s=parse_duration("0.1ms"),
    send_overhead_s=parse_duration("0.4ms"),
)
PINNED_FLAGS = [
    "--micro-batches",
    "4",
    "--schedule",
    "1f1b",
    "--no-recompute",
    "--bandwidth",
    "25GB/s",
    "--latency",
    "20us",
    "--action-overhead",
    "0.1ms",
    "--send-overhead",
    "0.4ms",
]


def test_the_entry_points_take_the_same_choice_and_link_values() -> None:
    import dataclasses
    import inspect

    loose = {f.name for cls in (autopipe.Choices, autopipe.Link) for f in dataclasses.fields(cls)}
    for name, fn in ENTRY_POINTS.items():
        params = inspect.signature(fn).parameters
        assert params["choices"].annotation == "Choices | None" and params["choices"].default is None, name
        assert params["link"].annotation == "Link | None" and params["link"].default is None, name
        assert params["choices"].kind == params["link"].kind == inspect.Parameter.KEYWORD_ONLY, name
        assert not loose & set(params) and not any(p.startswith("link_") for p in params), name  # no keyword list again
        assert {"batch_size", "memory", "stages"} <= set(params), name


def test_a_choice_passed_loose_says_where_it_goes() -> None:
    with pytest.raises(
        PlanError, match=r"^micro_batches is one of the plan's choices: pass choices=Choices\(micro_batches=\.\.\.\)"
    ):
        autopipe.plan(MLP_FILE, kwargs=KWARGS, batch_size=8, micro_batches=4)
    with pytest.raises(PlanError, match=r"^link_bandwidth describes the link: pass link=Link\(\.\.\.\)"):
        autopipe.plan(MLP_FILE, kwargs=KWARGS, batch_size=8, link_bandwidth=1e9)


def test_plan_and_plan_profile_give_the_command_lines_plan_for_the_same_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.planner.test_exact import chain

    prof, path, out = chain(8, 1), tmp_path / "profile.json", tmp_path / "plan.json"
    prof.save(path)
    argv = [
        "plan",
        "--profile",
        str(path),
        "--devices",
        "2",
        "--batch-size",
        "8",
        "--memory",
        "1GiB",
        *PINNED_FLAGS,
        "-o",
        str(out),
    ]
    assert main(argv) == 0, capsys.readouterr()
    by_cli = Plan.load(out).to_dict()
    by_profile = autopipe.plan_profile(path, devices=2, batch_size=8, memory="1GiB", choices=PINNED, link=PRICED)
    by_plan = autopipe.plan(
        nn.Linear(2, 2),
        torch.zeros(4, 2),
        stages=2,
        batch_size=8,
        memory="1GiB",
        choices=PINNED,
        link=PRICED,
        profile_data=prof,
    )
    assert by_profile.to_dict() == by_plan.to_dict() == by_cli
    assert (by_cli["micro_batches"], by_cli["schedule"], by_cli["recompute_policy"], by_cli["link_bandwidth"]) == (
        4,
        "1f1b",
        "never",
        25e9,
    )
    balanced = autopipe.plan_profile(
        prof, stages=2, batch_size=8, memory="1GiB", choices=PINNED, link=PRICED, balance=[5, 3]
    )
    assert main([*argv[:-2], "--balance", "5,3", "-o", str(out)]) == 0, capsys.readouterr()
    assert balanced.to_dict() == Plan.load(out).to_dict() and balanced.balance == (5, 3)
    assert (
        autopipe.plan(
            nn.Linear(2, 2),
            torch.zeros(4, 2),
            devices=2,
            batch_size=8,
            memory="1GiB",
            choices=PINNED,
            link=PRICED,
            balance=[5, 3],
            profile_data=prof,
        )
        == balanced
    )


@pytest.mark.slow
def test_plan_cluster_gives_the_command_lines_plan_for_the_same_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    gpt, out = str(Path(__file__).resolve().parent.parent / "models" / "gpt.py"), tmp_path / "plan.json"
    argv = [
        "plan",
        gpt,
        "-k",
        "n_layer=4",
        "--device",
        "h100",
        "--gpus",
        "8",
        "--batch-size",
        "16",
        "--stages",
        "2",
        *PINNED_FLAGS,
        "-o",
        str(out),
    ]
    assert main(argv) == 0, capsys.readouterr()
    by_api = autopipe.plan_cluster(
        gpt, kwargs={"n_layer": 4}, device="h100", gpus=8, batch_size=16, stages=2, choices=PINNED, link=PRICED
    )
    assert by_api.to_dict() == Plan.load(out).to_dict()
    assert (by_api.devices, by_api.micro_batches, by_api.schedule, by_api.recompute_policy) == (2, 4, "1f1b", "never")


def test_devices_and_stages_are_one_thing(tmp_path: Path) -> None:
    from tests.planner.test_exact import chain

    prof = chain(8, 1)
    same = [autopipe.plan_profile(prof, batch_size=8, memory="1GiB", **{k: 2}).to_dict() for k in ("devices", "stages")]  # type: ignore[arg-type]
    assert same[0] == same[1]
    assert autopipe.plan_profile(prof, devices=2, stages=2, batch_size=8, memory="1GiB").to_dict() == same[0]
    with pytest.raises(PlanError, match=r"^devices and stages are the same thing \(pipeline devices\); give one$"):
        autopipe.plan_profile(prof, devices=2, stages=4, batch_size=8, memory="1GiB")
    with pytest.raises(
        PlanError, match=r"^stages must be at least 1 \(got 0\)$"
    ):  # the API's words, not the CLI's flags
        autopipe.plan_profile(prof, stages=0, batch_size=8, memory="1GiB")


def test_a_target_is_a_choice_and_the_note_shows_both_plans() -> None:
    from tests.planner.test_search import random_profile

    prof = random_profile(8, 3)
    free = autopipe.api.plan_profile(prof, devices=4, batch_size=8, memory=2**32)
    plan = autopipe.api.plan_profile(
        prof, devices=4, batch_size=8, memory=2**32, choices=autopipe.Choices(target="megatron")
    )
    assert plan.schedule in ("1f1b", "interleaved-1f1b") and plan.iteration_time_s >= free.iteration_time_s
    assert plan.target == "megatron" and plan.free_plan == autopipe.api.FreePlan.of(free)  # the API result keeps both
    note = autopipe.api.target_note(plan)
    assert note.startswith(f"free plan (any schedule): {free.schedule}") and "; target=megatron (Megatron-LM): " in note
    extra = plan.iteration_time_s / free.iteration_time_s - 1
    assert note.endswith(f"{plan.iteration_time_s:.3g} s/iter ({extra:+.1%})")
    assert free.free_plan is None and autopipe.api.target_note(free) == ""  # the free plan: nothing beside it
    torch = autopipe.api.plan_profile(
        prof, devices=4, batch_size=8, memory=2**32, choices=autopipe.Choices(target="torch")
    )
    assert torch.target == "torch" and torch.free_plan is not None  # every schedule, nothing recomputed
    assert not any(s.recompute for s in torch.stages)
