"""``autopipe run`` on gloo processes equals unsplit training, and resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

from autopipe.runtime import RunOptions, assemble_state_dict, run_threads
from tests.helpers import max_diff
from tests.runtime.helpers import LR, TOL, cached_plan, unsplit_reference

torch.set_num_threads(1)


@pytest.mark.slow
def test_cli_run_with_gloo_equals_unsplit_training_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = cached_plan("gpt", 2, "1f1b", 1, (1,))
    plan.save(tmp_path / "plan.json")
    common = [str(tmp_path / "plan.json"), "--optimizer", "SGD", "--lr", str(LR), "--timeout", "30"]
    code = main(
        [
            "run",
            *common,
            "--steps",
            "3",
            "--save-checkpoint",
            str(tmp_path / "c3"),
            "--trace",
            str(tmp_path / "t.json"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "stage 1 B" in out and "bubble" in out and "loss per step" in out
    assert max_diff(assemble_state_dict(tmp_path / "c3"), unsplit_reference("gpt")[1]) <= TOL
    assert {e.get("tid") for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]} >= {
        0,
        1,
    }
    code = main(
        [
            "run",
            *common,
            "--steps",
            "1",
            "--resume",
            str(tmp_path / "c3"),
            "--save-checkpoint",
            str(tmp_path / "c4"),
            "--json",
        ]
    )
    assert code == 0
    assert len(json.loads(capsys.readouterr().out)["losses"]) == 1
    run_threads(plan, RunOptions(steps=4, optimizer="SGD", lr=LR, save_checkpoint=str(tmp_path / "t4")))
    threads, procs = assemble_state_dict(tmp_path / "t4"), assemble_state_dict(tmp_path / "c4")
    assert all(torch.equal(threads[k], procs[k]) for k in threads)


CHARGPT = {"n_layer": 2, "n_embd": 32, "n_head": 4, "seq_len": 16}  # models/chargpt.py, small
CHAR_STEPS, CHAR_LR = 15, 1e-2  # beyond ~17 Adam steps at this rate float rounding (1e-7) grows chaotically


def _train_data_reference(path: Path, kwargs: dict[str, object], steps: int, batch_size: int, m: int) -> list[float]:
    """Per-step losses of the unsplit model trained on the file's train_data (Adam, as the run),
    each batch's gradient accumulated over the same m micro-batches (so float rounding matches)."""
    from autopipe.model.load import call_model, load_model

    torch.manual_seed(0)
    lm = load_model(str(path), kwargs)
    opt = torch.optim.Adam(lm.model.parameters(), lr=CHAR_LR)
    torch.manual_seed(0)
    assert lm.make_train_data is not None
    losses = []
    for _, (x, y) in zip(range(steps), lm.make_train_data(batch_size), strict=False):
        total = 0.0
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            loss = lm.loss_fn(call_model(lm.model, xi), yi) / m
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_both_engines_learn_real_text_from_train_data_as_one_process_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bundled real-text example (models/chargpt.py: the standard library's own source)
    trained through train_data by each engine on 2 gloo ranks: the loss falls well below
    ln(vocab) and equals single-process training step for step."""
    import math

    from tests.helpers import MODELS, even_plan

    model = MODELS / "chargpt.py"
    plan = even_plan(str(model), CHARGPT, stages=2, micro_batches=2, micro_batch_size=8)
    plan.save(tmp_path / "plan.json")
    ref = _train_data_reference(model, CHARGPT, CHAR_STEPS, plan.batch_size, plan.micro_batches)
    assert ref[0] > 0.9 * math.log(128) and ref[-1] < 0.75 * math.log(128), ref  # it learns
    for engine in ("autopipe", "torch"):
        extra = ["--plot", str(tmp_path / "loss.png")] if engine == "torch" else []
        code = main(
            [
                "run",
                str(tmp_path / "plan.json"),
                "--optimizer",
                "Adam",
                "--lr",
                str(CHAR_LR),
                "--timeout",
                "60",
                "--steps",
                str(CHAR_STEPS),
                "--device",
                "cpu",
                "--engine",
                engine,
                "--json",
                *extra,
            ]
        )
        captured = capsys.readouterr()
        assert code == 0, captured.err
        got = json.loads(captured.out)  # stdout is one JSON object and nothing else
        assert f"training on train_data() from {model}" in captured.err
        assert f"step {CHAR_STEPS} ({CHAR_STEPS}/{CHAR_STEPS}) loss" in captured.err
        assert got["engine"] == engine and got["data"] == "train_data"
        assert max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref, strict=True)) <= TOL, (
            engine,
            got["losses"],
            ref,
        )
        assert got["iteration_time_s"] > 0 and got["predicted_iteration_time_s"] == plan.iteration_time_s
        assert len(got["peak_memory_bytes"]) == 2 and all(b > 0 for b in got["peak_memory_bytes"])
        assert got["memory_kind"].startswith("cpu: ")
        assert any(r["what"] == "peak memory rank 1" for r in got["rows"])
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code = main(["run", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "loss.png")])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "autopipe: error: --plot needs matplotlib, which is not installed; pip install 'autopipe[plot]' or drop --plot"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
# encoder-decoder (dict inputs); Mixtral (mixture of experts) and the other architectures go
# through both engines in tests/stages/test_export.py, without the command line around them
@pytest.mark.parametrize("arch", ["t5"])
def test_both_engines_run_a_hugging_face_model_as_one_process(
    arch: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``autopipe run --engine autopipe|torch`` on a Hugging Face model from its config (the
    five-architecture matrix runs the same API in one process pair: tests/stages/test_export.py)."""
    pytest.importorskip("transformers")
    from tests.helpers import FIXTURES, even_plan
    from tests.stages.test_export import _hf_reference

    plan = even_plan(str(FIXTURES / "hf_zoo.py"), {"arch": arch}, stages=2, micro_batches=2, micro_batch_size=2)
    plan.save(tmp_path / "plan.json")
    want, _ = _hf_reference(plan)  # 3 SGD steps at lr 0.1 on the model file's fixed batch
    for engine in ("autopipe", "torch"):
        code = main(
            [
                "run",
                str(tmp_path / "plan.json"),
                "--optimizer",
                "SGD",
                "--lr",
                "0.1",
                "--steps",
                "3",
                "--timeout",
                "60",
                "--device",
                "cpu",
                "--engine",
                engine,
                "--json",
            ]
        )
        captured = capsys.readouterr()
        assert code == 0, captured.err
        losses = json.loads(captured.out)["losses"]
        assert max(abs(a - b) / abs(b) for a, b in zip(losses, want, strict=True)) <= TOL, (engine, losses, want)


def test_bad_train_data_is_one_line_before_any_rank_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from autopipe.runtime.run import launch as launch_module
    from tests.helpers import even_plan

    model = tmp_path / "td.py"
    model.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model(): return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))\n"
        "def example_inputs(b): return torch.randn(b, 4)\n"
        "def train_data(b): return [1, 2, 3]\n"
    )
    even_plan(str(model), stages=2).save(tmp_path / "plan.json")

    def no_launch(*args: object) -> None:
        raise AssertionError("a rank was started")

    monkeypatch.setattr(launch_module, "launch", no_launch)
    assert main(["run", str(tmp_path / "plan.json"), "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        f"autopipe: error: batch 0 of train_data() in {model} is a int; "
        "yield (inputs, targets) pairs (targets None when loss_fn takes only the output)\n"
    )
