"""Checkpoints: a resumed run continues bit for bit; files are loaded as data, never as code."""

from __future__ import annotations

import json
import pathlib
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

from autopipe.errors import RuntimeFailure
from autopipe.runtime import RunOptions, assemble_state_dict, run_threads
from autopipe.runtime.checkpoint import load_file, read_meta
from tests.runtime.helpers import cached_plan, rebuilt_for

torch.set_num_threads(1)


def test_resume_continues_bit_for_bit(tmp_path: Path) -> None:
    plan = cached_plan("gpt", 2, "zb-h1")
    base = dict(optimizer="Adam", lr=1e-2, timeout_s=30)
    run_threads(plan, RunOptions(steps=4, save_checkpoint=str(tmp_path / "full"), **base))  # type: ignore[arg-type]
    run_threads(plan, RunOptions(steps=2, save_checkpoint=str(tmp_path / "half"), **base))  # type: ignore[arg-type]
    resumed = RunOptions(steps=2, resume=str(tmp_path / "half"), save_checkpoint=str(tmp_path / "end"), **base)  # type: ignore[arg-type]
    results = run_threads(plan, resumed)
    assert results[0].steps_done == 4
    full, end = assemble_state_dict(tmp_path / "full"), assemble_state_dict(tmp_path / "end")
    assert set(full) == set(end)
    assert all(torch.equal(full[k], end[k]) for k in full)


class _Payload:
    """Unpickling this creates ``marker``: a checkpoint that would run code if loaded as pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (pathlib.Path.touch, (self.marker,))


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("Adam", lambda ps: torch.optim.Adam(ps, lr=0.1)),
        ("AdamW", lambda ps: torch.optim.AdamW(ps, lr=0.1, amsgrad=True)),
        ("SGD", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)),
    ],
)
def test_optimizer_state_loads_as_data(
    name: str, make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = make(list(model.parameters()))
    for _ in range(2):
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
    torch.save({"optimizer": opt.state_dict()}, tmp_path / "rank-0.pt")
    back = make(list(torch.nn.Linear(4, 3).parameters()))
    back.load_state_dict(load_file(tmp_path / "rank-0.pt")["optimizer"])  # weights_only=True
    a, b = opt.state_dict(), back.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i, state in a["state"].items():
        assert state.keys() == b["state"][i].keys()
        assert all(torch.equal(torch.as_tensor(v), torch.as_tensor(b["state"][i][k])) for k, v in state.items())


@pytest.fixture(scope="module")
def _checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint (one step of a 2-rank plan), saved once for this module's tests."""
    folder = tmp_path_factory.mktemp("saved") / "ck"
    plan = cached_plan("skip", 2, "1f1b")
    run_threads(plan, RunOptions(steps=1, lr=0.1, timeout_s=30, save_checkpoint=str(folder)), rebuilt_for(plan))
    assert json.loads((folder / "meta.json").read_text())["step"] == 1
    return folder


def _resume(checkpoint: Path, tmp_path: Path) -> Callable[[], object]:
    """Copy the checkpoint into ``tmp_path / "ck"``; a function resuming the run from there."""
    shutil.copytree(checkpoint, tmp_path / "ck")
    plan = cached_plan("skip", 2, "1f1b")
    options = RunOptions(steps=1, lr=0.1, timeout_s=30, resume=str(tmp_path / "ck"))
    return lambda: run_threads(plan, options, rebuilt_for(plan))


def test_a_crafted_checkpoint_runs_no_code(_checkpoint: Path, tmp_path: Path) -> None:
    resume = _resume(_checkpoint, tmp_path)
    marker = tmp_path / "marker"
    torch.save({"optimizer": _Payload(marker)}, tmp_path / "ck" / "rank-0.pt")
    path = tmp_path / "ck" / "rank-0.pt"
    with pytest.raises(RuntimeFailure) as info:
        resume()
    assert str(info.value) == (
        f"{path} is not a valid checkpoint file (it holds Python objects, not only tensors and numbers; "
        "not loaded, as that could run code); save the checkpoint again with --save-checkpoint"
    )
    assert not marker.exists()
    # as plain pickle it would have run: the test's payload is real
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_stage_file_is_one_line(damage: str, _checkpoint: Path, tmp_path: Path) -> None:
    resume = _resume(_checkpoint, tmp_path)
    path = tmp_path / "ck" / "stage-1.pt"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"not a checkpoint " * 9, "empty": b""}[damage])
    with pytest.raises(RuntimeFailure) as info:
        resume()
    message = str(info.value)
    assert message.startswith(f"{path} is not a valid checkpoint file (truncated or not written by torch.save: ")
    assert message.endswith("); save the checkpoint again with --save-checkpoint") and "\n" not in message
    with pytest.raises(RuntimeFailure, match=r"stage-1\.pt is not a valid checkpoint file"):
        assemble_state_dict(tmp_path / "ck")


def test_a_damaged_meta_json_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text('{"fingerprint": "abc", "step": "4", "stages": 2}')
    with pytest.raises(
        RuntimeFailure, match=r"meta.json is not a valid checkpoint file \(it needs fingerprint: a string, step"
    ):
        read_meta(tmp_path)
    (tmp_path / "meta.json").write_bytes(b"\xff\xfe")
    with pytest.raises(RuntimeFailure, match=r"meta.json is not a valid checkpoint file \((JSON|Unicode)DecodeError: "):
        read_meta(tmp_path)


@pytest.mark.slow
def test_autopipe_run_resume_from_a_crafted_checkpoint_is_one_line(
    _checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(_checkpoint, tmp_path / "ck")
    marker = tmp_path / "marker"
    torch.save({"optimizer": _Payload(marker)}, tmp_path / "ck" / "rank-1.pt")
    cached_plan("skip", 2, "1f1b").save(tmp_path / "plan.json")
    argv = ["run", str(tmp_path / "plan.json"), "--steps", "1", "--device", "cpu", "--timeout", "30"]
    assert main([*argv, "--resume", str(tmp_path / "ck")]) == 1
    assert capsys.readouterr().err == (
        f"autopipe: error: rank 1 failed: RuntimeFailure: {tmp_path / 'ck' / 'rank-1.pt'} is not a valid checkpoint "
        "file (it holds Python objects, not only tensors and numbers; not loaded, as that could run code); "
        "save the checkpoint again with --save-checkpoint\n"
    )
    assert not marker.exists()
