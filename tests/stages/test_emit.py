"""Emitted stage folders run without autopipe, merge back bit for bit, and fail cleanly."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

from autopipe.errors import EmitError, OutputError, PlanError
from autopipe.stages.emit import emit
from autopipe.stages.merge import merge_state_dict, read_manifest
from autopipe.stages.rebuild import rebuild_model
from tests.helpers import FIXTURES, even_plan

torch.set_num_threads(1)

CASES = [
    ("gpt.py", 2, 1, "auto"),
    ("gpt.py", 2, 2, "auto"),  # interleaved: 4 stages on 2 ranks; tied weight on stages 0 and 3
    ("gpt.py", 3, 1, "export"),
    ("llama.py", 3, 1, "auto"),
    ("resnet.py", 2, 1, "auto"),
    ("resnet.py", 4, 1, "auto"),
    ("unet.py", 3, 1, "auto"),  # long skip connections
    ("unet.py", 4, 1, "auto"),
    ("mlp.py", 2, 1, "auto"),
    ("mlp.py", 4, 1, "auto"),
]

CHAIN = r"""
import importlib.util, json, os, sys
sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "autopipe"))]

class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("autopipe", "autopipe.cli"):
            raise ImportError("autopipe must not be needed")
        return None

sys.meta_path.insert(0, _Block())
import torch
torch.set_num_threads(1)
results = {}
for case in sorted(os.listdir("cases")):
    root = os.path.join("cases", case, "stages")
    manifest = json.load(open(os.path.join(root, "manifest.json")))
    env = dict(zip([i["name"] for i in manifest["inputs"]], torch.load(os.path.join("cases", case, "inputs.pt"))))
    for st in manifest["stages"]:
        spec = importlib.util.spec_from_file_location(f"{case}_{st['package']}", os.path.join(root, st["module"]))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        module = mod.load().eval()
        with torch.no_grad():
            outs = module(*[env[i["name"]] for i in st["inputs"]])
        assert len(outs) == len(st["outputs"])
        env.update(zip([o["name"] for o in st["outputs"]], outs))
    outputs = [env[o["name"]] for o in manifest["outputs"]]
    expected = torch.load(os.path.join("cases", case, "expected.pt"))
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    results[case] = max(float((a - b).abs().max()) for a, b in zip(outputs, expected))
print(json.dumps({"results": results, "autopipe_loaded": any(m.startswith("autopipe") for m in sys.modules)}))
"""


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    """Every case emitted once: case name -> (stages folder, plan)."""
    base = tmp_path_factory.mktemp("emitted")
    out = {}
    for model, stages, virtual, tracer in CASES:
        name = f"{model[:-3]}-{stages}x{virtual}-{tracer}"
        plan = even_plan(
            model, stages=stages, virtual=virtual, tracer=tracer, schedule="interleaved-1f1b" if virtual > 1 else "1f1b"
        )
        folder = base / name / "stages"
        emit(plan, folder)
        out[name] = (folder, plan)
    return out


@pytest.mark.slow
def test_emitted_stages_run_without_autopipe(emitted: dict[str, tuple[Path, object]], tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    for name, (folder, plan) in emitted.items():
        case = elsewhere / "cases" / name
        shutil.copytree(folder, case / "stages")  # moved away from where it was written
        loaded = rebuild_model(plan)  # type: ignore[arg-type]
        inputs = loaded.make_inputs(plan.micro_batch_size)  # type: ignore[attr-defined]
        model = loaded.model.eval()
        with torch.no_grad():
            expected = model(inputs)
        torch.save([inputs], case / "inputs.pt")
        torch.save(expected, case / "expected.pt")
    (elsewhere / "chain.py").write_text(CHAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [sys.executable, "-I", "chain.py"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not report["autopipe_loaded"]
    assert set(report["results"]) == set(emitted)
    for name, diff in report["results"].items():
        assert diff <= 1e-6, (name, diff)


@pytest.mark.slow
def test_merge_is_bit_for_bit(emitted: dict[str, tuple[Path, object]]) -> None:
    for name, (folder, plan) in emitted.items():
        original = rebuild_model(plan).model.state_dict()  # type: ignore[arg-type]
        merged = merge_state_dict(folder)
        assert list(merged) == list(original), name
        for key, value in original.items():
            assert merged[key].dtype == value.dtype and torch.equal(merged[key], value), (name, key)


@pytest.mark.slow
def test_emitted_source_passes_ruff_with_the_repositorys_settings(emitted: dict[str, tuple[Path, object]]) -> None:
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    root = Path(__file__).resolve().parents[2]
    folders = sorted({str(folder) for folder, _ in emitted.values()})
    result = subprocess.run(
        # every rule of the repository's but the line length: a forward's lines are fx's, as long as
        # the expressions they compute (the generator does not wrap code; autopipe's own lines fit)
        [
            str(ruff),
            "check",
            "--config",
            str(root / "pyproject.toml"),
            "--extend-ignore",
            "E501",
            "--no-cache",
            *folders,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "All checks passed!" in result.stdout, result.stdout + result.stderr
    assert sum(1 for f in folders for _ in Path(f).glob("*/stage.py")) >= 2 * len(CASES)  # every stage was linted


def test_manifest_routing_tied_and_skip(tmp_path: Path) -> None:
    gpt = emit(even_plan("gpt.py", stages=3), tmp_path / "gpt")
    shared = [t for s in gpt["stages"] for t in s["tensors"] if t["shared"]]
    assert {s["name"] for s in shared} == {"wte.weight", "lm_head.weight"}
    assert all(sorted(t["original"]) == ["lm_head.weight", "wte.weight"] for t in shared)
    assert gpt["shared"] == [{"original": ["wte.weight", "lm_head.weight"], "stages": [0, 2]}]
    assert gpt["stages"][1]["inputs"][0] == {"name": "add_2", "shape": [2, 64, 128], "dtype": "float32", "from": 0}
    assert (gpt["schedule"], gpt["micro_batches"], gpt["micro_batch_size"]) == ("1f1b", 2, 2)
    unet = emit(even_plan("unet.py", stages=3), tmp_path / "unet")
    skips = [t for t in unet["transfers"] if t["skip"]]
    assert skips and all(t["to"] > t["from"] + 1 for t in skips)
    last = unet["stages"][-1]
    assert {i["from"] for i in last["inputs"]} == {0, 1}
    assert unet["outputs"] == [{"name": "outc", "stage": 2}]
    assert read_manifest(tmp_path / "unet") == unet


def test_refuses_non_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = tmp_path / "plan.json"
    even_plan("mlp.py").save(plan_file)
    dest = tmp_path / "stages"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    code = main(["emit", str(plan_file), "-o", str(dest)])
    err = capsys.readouterr().err
    assert code == 2
    assert (
        err.strip()
        == f"autopipe: error: {dest} is not empty (1 entries); emit into a new folder or pass --force to replace it"
    )
    assert [p.name for p in dest.iterdir()] == ["keep.txt"] and (dest / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left behind
    assert main(["emit", str(plan_file), "-o", str(dest), "--force"]) == 0
    assert not (dest / "keep.txt").exists() and (dest / "manifest.json").is_file()
    assert main(["merge", str(dest), "-o", str(tmp_path / "model.pt")]) == 0
    merged = torch.load(tmp_path / "model.pt", weights_only=True)
    original = rebuild_model(even_plan("mlp.py")).model.state_dict()
    assert list(merged) == list(original) and all(torch.equal(merged[k], original[k]) for k in original)


def test_failed_emit_leaves_nothing(tmp_path: Path) -> None:
    plan = even_plan("mlp.py")
    wrong = dataclasses.replace(plan, recipe=dataclasses.replace(plan.recipe, fingerprint="0" * 16))
    with pytest.raises(PlanError, match="made for another model"):
        emit(wrong, tmp_path / "stages")
    assert list(tmp_path.iterdir()) == []


def test_weights_from_a_state_dict(tmp_path: Path) -> None:
    plan = even_plan("mlp.py")
    model = rebuild_model(plan).model
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    manifest = emit(plan, tmp_path / "stages", state_dict=tmp_path / "sd.pt")
    assert manifest["seed"] is None
    merged = merge_state_dict(tmp_path / "stages")
    assert all(torch.equal(merged[k], v) for k, v in model.state_dict().items())
    torch.save({"nope": torch.zeros(1)}, tmp_path / "bad.pt")
    with pytest.raises(Exception, match="does not fit the plan's model"):
        emit(plan, tmp_path / "other", state_dict=tmp_path / "bad.pt")


def test_safetensors_format(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    plan = even_plan("gpt.py", stages=2)
    emit(plan, tmp_path / "stages", weights_format="safetensors")
    assert (tmp_path / "stages" / "stage0" / "weights.safetensors").is_file()
    merged = merge_state_dict(tmp_path / "stages")
    original = rebuild_model(plan).model.state_dict()
    assert all(torch.equal(merged[k], v) for k, v in original.items())


def test_no_weights_never_materialises(tmp_path: Path) -> None:
    # ~4e9 parameters: materialising them would need 17 GB; on meta it is only shapes.
    kwargs = ("preset='gpt3-175b'", "n_layer=2")
    plan = even_plan("gpt.py", kwargs, stages=2, micro_batch_size=1, device="meta")
    manifest = emit(plan, tmp_path / "stages", weights=False)
    assert manifest["weights"] is None
    assert not list((tmp_path / "stages").rglob("weights.*"))
    head = next(t for t in manifest["stages"][1]["tensors"] if t["name"] == "lm_head.weight")
    assert head["shape"] == [50257, 12288] and head["shared"]
    with pytest.raises(EmitError, match="--no-weights"):
        merge_state_dict(tmp_path / "stages")


def test_write_failure_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autopipe.stages.emit as emit_module

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(emit_module, "_save", broken)
    with pytest.raises(OutputError, match=r"^cannot write the stages to .*/stages: disk full; nothing was changed$"):
        emit(even_plan("mlp.py"), tmp_path / "stages")
    assert list(tmp_path.iterdir()) == []


def test_user_leaf_module_is_kept_whole(tmp_path: Path) -> None:
    """More in test_emit_leaf.py (chained outputs, a moved model file)."""
    plan = even_plan("gpt.py", leaf_modules=("MLP",))
    manifest = emit(plan, tmp_path / "stages")
    need = manifest["needs_model_file"]
    assert need["stages"] == [0, 1] and need["path"] == str(Path(plan.recipe.model_file).resolve())
    assert {path: cls for path, cls in need["modules"].items() if cls == "MLP"} == {
        f"blocks.{i}.mlp": "MLP" for i in range(4)
    }


HF_CHAIN = r"""
import importlib.util, json, os, sys
import torch
torch.set_num_threads(1)
root, batch = sys.argv[1], torch.load(sys.argv[2])
manifest = json.load(open(os.path.join(root, "manifest.json")))
results = {}
for mode in ("eval", "train"):
    env = {i["name"]: batch[i["name"]] for i in manifest["inputs"]}
    for st in manifest["stages"]:
        spec = importlib.util.spec_from_file_location(f"{mode}_{st['package']}", os.path.join(root, st["module"]))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        module = getattr(mod.load(), mode)()
        with torch.no_grad():
            outs = module(*[env[i["name"]] for i in st["inputs"]])
        env.update(zip([o["name"] for o in st["outputs"]], outs))
    results[mode] = {o["name"]: env[o["name"]] for o in manifest["outputs"]}
torch.save(results, sys.argv[3])
"""


@pytest.mark.slow
@pytest.mark.usefixtures("transformers")
@pytest.mark.parametrize(
    ("arch", "dropout", "micro_batch_size"), [("llama", 0.0, 1), ("t5", 0.1, 2), ("deberta", 0.0, 2)]
)
def test_emitted_hugging_face_stages_take_any_micro_batch_size_and_honour_eval(
    arch: str, dropout: float, micro_batch_size: int, tmp_path: Path
) -> None:
    """Export-traced stages, chained at 3 samples (the plan's micro-batch is 1 or 2), without
    autopipe: the unsplit model's output in eval mode (T5 with dropout 0.1: hidden and SDPA
    attention dropout off), dropout on in train mode; outputs named as the model names them.
    DeBERTa-v2's relative positions: a stage input named like a module path (``LayerNorm``) whose
    placeholder fx renames (``layer_norm``), which once sent the emit to static shapes."""
    from tests.fixtures import hf_zoo

    plan = even_plan(
        str(FIXTURES / "hf_zoo.py"), {"arch": arch, "dropout": dropout}, stages=2, micro_batch_size=micro_batch_size
    )
    manifest = emit(plan, tmp_path / "stages")
    assert manifest["tracer"] == "export" and manifest["shapes_note"] == ""
    assert all(dims[:1] == [0] for dims in manifest["symbolic_dims"].values())  # the batch dim is free
    want = {"llama": ["logits"], "t5": ["logits", "encoder_last_hidden_state"], "deberta": ["logits"]}[arch]
    assert [o["name"] for o in manifest["outputs"]] == want
    assert manifest["inputs"][0]["shape"][0] == micro_batch_size  # shapes at the plan's size
    sent = [t["value"] for t in manifest["transfers"]]
    assert sent and not any(
        re.fullmatch(r"[a-z_]+_\d+", v) and v.split("_")[0] in ("add", "to", "mul", "view") for v in sent
    ), sent
    batch = hf_zoo.example_inputs(3, arch)
    torch.save(batch, tmp_path / "batch.pt")
    (tmp_path / "chain.py").write_text(HF_CHAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [sys.executable, "-I", "chain.py", str(tmp_path / "stages"), "batch.pt", "out.pt"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(tmp_path / "out.pt")
    model = rebuild_model(plan).model.eval()  # type: ignore[arg-type]
    with torch.no_grad():
        expected = model(**batch)
    for name in want:
        assert got["eval"][name].shape[0] == 3
        assert float((got["eval"][name] - expected[name]).abs().max()) <= 1e-5, name
    if dropout > 0:
        assert float((got["train"]["logits"] - expected["logits"]).abs().max()) > 1e-3  # dropout is on


@pytest.mark.slow
@pytest.mark.usefixtures("transformers")
def test_the_manifest_says_which_dim_the_model_fixes_and_where(tmp_path: Path) -> None:
    """Mamba's scan loops over the sequence in Python: the batch stays free, the length does not,
    and the manifest says so, naming the model's line."""
    plan = even_plan(str(FIXTURES / "hf_state.py"), {"arch": "mamba"}, stages=2, micro_batch_size=2)
    manifest = emit(plan, tmp_path / "stages", weights=False)
    assert manifest["symbolic_dims"] == {"input_ids": [0], "attention_mask": [0]}  # the batch only
    fixed = r"dim 1 is fixed at 8 [^;]*modeling_mamba\.py:\d+ in \w+\)?"
    assert re.fullmatch(
        rf"static shapes in part: input_ids {fixed}; attention_mask {fixed}; the model's code needs that size as a "
        r"number \(a Python loop over it, .*\), so torch\.export kept it constant and the stages take inputs of "
        "that size only",
        manifest["shapes_note"],
    ), manifest["shapes_note"]


def test_progress_tells_each_step_and_every_stage(tmp_path: Path) -> None:
    calls: list[tuple[str, int, int]] = []
    emit(
        even_plan("mlp.py", stages=3),
        tmp_path / "out",
        progress=lambda what, done, total: calls.append((what, done, total)),
    )
    assert calls == [
        ("rebuilding the model", 0, 0),
        ("tracing and splitting the model", 0, 0),
        ("writing stages", 0, 3),
        ("writing stages", 1, 3),
        ("writing stages", 2, 3),
    ]


def test_force_never_deletes_the_current_folder_or_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/security.md: "`emit -o DIR --force` replaces DIR only as a whole"
    work = tmp_path / "work"
    work.mkdir()
    even_plan("mlp.py").save(work / "plan.json")
    monkeypatch.chdir(work)
    for folder, said in [(".", "holds the current folder"), ("..", "holds the current folder")]:
        assert main(["emit", "plan.json", "-o", folder, "--force"]) == 2
        assert capsys.readouterr().err == (
            f"autopipe: error: {folder} {said}, which --force would delete; emit into a new folder\n"
        )
    monkeypatch.chdir(tmp_path)
    assert main(["emit", "work/plan.json", "-o", "work", "--force"]) == 2
    assert capsys.readouterr().err == (
        "autopipe: error: work holds the file work/plan.json, which --force would delete; emit into a new folder\n"
    )
    assert sorted(p.name for p in work.iterdir()) == ["plan.json"]


_FULL_EMIT = """
import resource, signal, sys
from autopipe.cli.main import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_write_that_fails_midway_is_one_line_and_keeps_the_old_folder(tmp_path: Path) -> None:
    import subprocess
    import sys

    plan_file = tmp_path / "plan.json"
    even_plan("mlp.py").save(plan_file)
    dest = tmp_path / "stages"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    argv = [sys.executable, "-c", _FULL_EMIT, "emit", str(plan_file), "-o", str(dest), "--force"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert (proc.returncode, proc.stderr) == (
        2,
        f"autopipe: error: cannot write the stages to {dest}: File too large; nothing was changed\n",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "stages"]
    assert [p.name for p in dest.iterdir()] == ["old.txt"]
    merged = tmp_path / "model.pt"
    emit(even_plan("mlp.py"), tmp_path / "new")
    argv = [sys.executable, "-c", _FULL_EMIT, "merge", str(tmp_path / "new"), "-o", str(merged)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert proc.returncode == 2 and proc.stderr.startswith(f"autopipe: error: cannot write {merged}: torch.save failed")
    assert not merged.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["new", "plan.json", "stages"]


@pytest.mark.slow
def test_concurrent_emits_into_one_folder_leave_one_whole_emit(tmp_path: Path) -> None:
    # docs/security.md: "`emit -o DIR --force` replaces DIR only as a whole, one emit at a time per folder"
    import subprocess
    import sys

    plan_file = tmp_path / "plan.json"
    even_plan("mlp.py").save(plan_file)
    dest = tmp_path / "stages"
    argv = [sys.executable, "-m", "autopipe.cli.main", "emit", str(plan_file), "-o", str(dest), "--force"]
    procs = [
        subprocess.Popen(argv, cwd=Path(__file__).parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = [(p.wait(timeout=180), p.stderr.read() if p.stderr else "") for p in procs]
    assert all(code == 0 for code, _ in results), results
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "stages"]  # no temp or old folder left
    assert sorted(p.name for p in dest.iterdir()) == ["manifest.json", "stage0", "stage1"] and read_manifest(dest)
