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
