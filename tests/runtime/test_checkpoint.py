"""Checkpoints: a resumed run continues bit for bit."""

from __future__ import annotations

from pathlib import Path

import torch

from autopipe.runtime import RunOptions, assemble_state_dict, run_threads
from tests.runtime.helpers import cached_plan

torch.set_num_threads(1)


def test_resume_continues_bit_for_bit(tmp_path: Path) -> None:
    plan = cached_plan("gpt", 2, "zb-h1")
    base = dict(optimizer="Adam", lr=1e-2, timeout_s=30)
    run_threads(plan, RunOptions(steps=4, save_checkpoint=str(tmp_path / "full"), **base))  # type: ignore[arg-type]
    run_threads(plan, RunOptions(steps=2, save_checkpoint=str(tmp_path / "half"), **base))  # type: ignore[arg-type]
    resumed = RunOptions(
        steps=2, resume=str(tmp_path / "half"), save_checkpoint=str(tmp_path / "end"), **base
    )  # type: ignore[arg-type]
    results = run_threads(plan, resumed)
    assert results[0].steps_done == 4
    full, end = assemble_state_dict(tmp_path / "full"), assemble_state_dict(tmp_path / "end")
    assert set(full) == set(end)
    assert all(torch.equal(full[k], end[k]) for k in full)
