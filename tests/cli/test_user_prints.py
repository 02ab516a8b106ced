"""A ``print`` in the user's model file never corrupts ``--json`` stdout; a blocking ``train_data`` meets
the model-file time limit in ``run``'s pre-check, before any rank starts.

The model prints in its import, its factory, ``example_inputs`` and its forward; with ``--json``
stdout must still be exactly one JSON object (the prints go to stderr), for ``profile``,
``plan MODEL`` and ``run`` (whose launcher imports the model file for its checks; the ranks
write their own output to their logs).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from autopipe.cli.main import main

from autopipe.plans import Plan
from tests.helpers import FIXTURES, ROOT

PRINTS = """
print("hello from the import")
_build = build_model
def build_model(**kw):
    print("hello from build_model")
    return _build(**kw)
_inputs = example_inputs
def example_inputs(batch_size, width=16):
    print("hello from example_inputs")
    return _inputs(batch_size, width)
_forward = MLP.forward
def _fwd(self, x):
    print("hello from forward")
    return _forward(self, x)
MLP.forward = _fwd
"""

FAST = ["--micro-batch-sizes", "4", "--warmup", "0", "--repeat", "1", "--device", "cpu", "--batch-size", "4"]


def printing_model(tmp_path: Path) -> Path:
    path = tmp_path / "loud.py"
    path.write_text((FIXTURES / "good_mlp.py").read_text() + PRINTS)
    return path


def plan_of(tmp_path: Path, model: Path) -> Path:
    """The fixture plan of good_mlp.py, its model file replaced by ``model`` (the same model)."""
    raw = json.loads(Plan.load(FIXTURES / "good_mlp_plan_v1.json").to_json())
    raw["recipe"]["model_file"] = str(model)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    return path


def cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["profile", "plan"])
def test_prints_in_the_model_go_to_stderr_under_json(tmp_path: Path, command: str) -> None:
    model = printing_model(tmp_path)
    more = ["--stages", "2", "--memory", "1GiB"] if command == "plan" else []
    code, out, err = cli([command, str(model), *FAST, *more, "-o", str(tmp_path / "out.json"), "--json"])
    assert code == 0, err
    assert isinstance(json.loads(out), dict)  # the whole of stdout is the one object
    for where in ("the import", "build_model", "example_inputs", "forward"):
        assert f"hello from {where}" in err


def test_prints_stay_on_stdout_without_json(tmp_path: Path) -> None:
    """Without --json nothing is redirected (a model's own output is the user's to see)."""
    model = printing_model(tmp_path)
    code, out, _err = cli(["profile", str(model), *FAST, "--load-timeout", "0", "-o", "/nonexistent-dir/x/p.json"])
    assert code == 2 and "hello" not in out  # refused before the model file is imported


@pytest.mark.slow
def test_run_json_stays_one_object_with_a_printing_model(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, printing_model(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "autopipe.cli.main", "run", str(plan), "--steps", "1", "--timeout", "60", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), dict)
    assert "hello from build_model" in done.stderr


def test_a_blocking_first_batch_meets_the_limit_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import autopipe.runtime.run.launch

    def launched(*args: object, **kwargs: object) -> None:
        raise AssertionError("ranks started")

    monkeypatch.setattr(autopipe.runtime.run.launch, "launch", launched)
    model = tmp_path / "slow_data.py"
    model.write_text(
        (FIXTURES / "good_mlp.py").read_text()
        + "\nimport time\ndef train_data(batch_size):\n    time.sleep(60)\n    yield None\n"
    )
    code, _out, err = cli(["run", str(plan_of(tmp_path, model)), "--steps", "1", "--load-timeout", "0.5"])
    assert code == 2, err
    assert err == (
        f"autopipe: error: batch 0 of train_data() in {model} did not finish within 0.5 s, the time limit for "
        "model-file calls; if it is only slow, raise the limit (--load-timeout SECONDS, 0 for none; "
        "autopipe.load_timeout(SECONDS) in Python)\n"
    )
