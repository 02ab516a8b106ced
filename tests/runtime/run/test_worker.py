"""Rebuilding a plan's model in a rank: a relative model file is found beside the plan."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import even_plan

torch.set_num_threads(1)


def test_a_relative_model_file_is_found_beside_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from autopipe.errors import ModelLoadError
    from autopipe.runtime.run.worker import rebuild

    shutil.copy(Path(__file__).parents[3] / "models" / "mlp.py", tmp_path / "mlp.py")
    monkeypatch.chdir(tmp_path)
    plan = even_plan("mlp.py", {"depth": 2}, stages=2, micro_batches=4)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ModelLoadError, match="model file not found"):
        rebuild(plan)
    assert rebuild(plan, base=str(tmp_path)).traced.fingerprint() == plan.recipe.fingerprint
