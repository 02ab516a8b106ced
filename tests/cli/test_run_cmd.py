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
    run_threads(
        plan, RunOptions(steps=4, optimizer="SGD", lr=LR, save_checkpoint=str(tmp_path / "t4"))
    )
    threads, procs = assemble_state_dict(tmp_path / "t4"), assemble_state_dict(tmp_path / "c4")
    assert all(torch.equal(threads[k], procs[k]) for k in threads)


TRAIN_DATA = '''

def train_data(batch_size, preset="tiny", vocab_size=None, block_size=None, **_unused):
    """Next-byte windows over this very file, shuffled (a real text, nothing downloaded)."""
    from torch.utils.data import DataLoader, TensorDataset

    cfg = make_config(preset, vocab_size=vocab_size, block_size=block_size)
    text = torch.tensor(list(open(__file__, "rb").read())) % cfg.vocab_size
    T = cfg.block_size
    windows = text[: len(text) // (T + 1) * (T + 1)].view(-1, T + 1)
    return DataLoader(TensorDataset(windows[:, :-1], windows[:, 1:]), batch_size=batch_size, shuffle=True, drop_last=True)
'''


def _train_data_reference(path: Path, kwargs: dict[str, object], steps: int) -> list[float]:
    from autopipe.model.load import call_model, load_model

    torch.manual_seed(0)
    lm = load_model(str(path), kwargs)
    opt = torch.optim.SGD(lm.model.parameters(), lr=LR)
    torch.manual_seed(0)
    assert lm.make_train_data is not None
    losses = []
    for _, (x, y) in zip(range(steps), lm.make_train_data(8), strict=False):
        loss = lm.loss_fn(call_model(lm.model, x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_both_engines_train_on_train_data_as_one_process_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers import ROOT, even_plan
    from tests.runtime.helpers import GPT

    model = tmp_path / "gptd.py"
    model.write_text((ROOT / "models" / "gpt.py").read_text() + TRAIN_DATA)
    plan = even_plan(str(model), GPT[1], stages=2, micro_batches=4)
    plan.save(tmp_path / "plan.json")
    ref = _train_data_reference(model, GPT[1], 3)
    for engine in ("autopipe", "torch"):
        extra = ["--plot", str(tmp_path / "loss.png")] if engine == "torch" else []
        code = main(["run", str(tmp_path / "plan.json"), "--optimizer", "SGD", "--lr", str(LR), "--timeout", "60",
                     "--steps", "3", "--device", "cpu", "--engine", engine, "--json", *extra])  # fmt: skip
        captured = capsys.readouterr()
        assert code == 0, captured.err
        got = json.loads(captured.out)  # stdout is one JSON object and nothing else
        assert f"training on train_data() from {model}" in captured.err and "step 3 (3/3) loss" in captured.err
        assert got["engine"] == engine and got["data"] == "train_data"
        assert max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref, strict=True)) <= TOL, (engine, got["losses"], ref)
        assert got["iteration_time_s"] > 0 and got["predicted_iteration_time_s"] == plan.iteration_time_s
        assert len(got["peak_memory_bytes"]) == 2 and all(b > 0 for b in got["peak_memory_bytes"])
        assert got["memory_kind"].startswith("cpu: ")
        assert any(r["what"] == "peak memory rank 1" for r in got["rows"])
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code = main(["run", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "loss.png")])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "autopipe: error: --plot needs matplotlib, which is not installed; pip install 'autopipe[plot]' or drop --plot"
    )
