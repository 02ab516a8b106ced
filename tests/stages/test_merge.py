"""merge reads stage folders as data: only files inside the folder, only tensors, checked."""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from autopipe.cli.main import main

from autopipe.errors import EmitError
from autopipe.stages.emit import emit
from autopipe.stages.merge import merge_state_dict
from autopipe.stages.rebuild import rebuild_model
from tests.helpers import even_plan


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("merge") / "stages"
    emit(even_plan("mlp.py"), folder)
    return folder


@pytest.fixture
def stages(emitted: Path, tmp_path: Path) -> Path:
    """A fresh copy of the emitted folder, for a test to spoil."""
    return Path(shutil.copytree(emitted, tmp_path / "stages"))


def _edit(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def _refused(folder: Path, message: str) -> None:
    with pytest.raises(EmitError) as info:
        merge_state_dict(folder)
    text = str(info.value)
    assert "\n" not in text
    assert text == message.format(root=folder), text


class _Payload:
    """Pickles to a call that writes the marker file when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_the_copy_merges_bit_for_bit(stages: Path) -> None:
    merged = merge_state_dict(stages)
    original = rebuild_model(even_plan("mlp.py")).model.state_dict()  # the model emit was given: same seed
    assert original and list(merged) == list(original)  # the same keys, in the model's order
    for key, value in original.items():
        assert isinstance(merged[key], torch.Tensor) and merged[key].dtype == value.dtype, key
        assert merged[key].shape == value.shape and torch.equal(merged[key], value), key


@pytest.mark.parametrize("name", ["../elsewhere/other.pt", "/etc/passwd", "stage0/../../x.pt"])
def test_weights_outside_the_folder_are_refused(stages: Path, name: str) -> None:
    # docs/security.md: "`merge` reads only from inside the folder: it refuses absolute paths, `..`"
    elsewhere = stages.parent / "elsewhere"
    elsewhere.mkdir()
    torch.save(torch.load(stages / "stage0" / "weights.pt", weights_only=True), elsewhere / "other.pt")

    def point(m: dict[str, Any]) -> None:
        m["stages"][0]["weights"] = name

    _edit(stages, point)
    _refused(
        stages,
        f"{{root}}/manifest.json names weights file {name!r} outside the folder; "
        "merge reads only files inside {root}",
    )


def test_a_symlink_out_of_the_folder_is_refused(stages: Path) -> None:
    outside = stages.parent / "outside.pt"
    shutil.move(stages / "stage0" / "weights.pt", outside)
    os.symlink(outside, stages / "stage0" / "weights.pt")
    _refused(
        stages,
        "{root}/manifest.json names weights file 'stage0/weights.pt' outside the folder; "
        "merge reads only files inside {root}",
    )


def test_truncated_and_garbage_weights(stages: Path) -> None:
    weights = stages / "stage0" / "weights.pt"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        EmitError,
        match=r"^weights file .*stage0/weights.pt is truncated or not a tensor file \(.+\); emit the stages again$",
    ):
        merge_state_dict(stages)
    weights.write_bytes(random.Random(0).randbytes(4096))
    with pytest.raises(
        EmitError,
        match=r"^weights file .*stage0/weights.pt is truncated or not a tensor file \(.+\); emit the stages again$",
    ):
        merge_state_dict(stages)
    torch.save([torch.zeros(1)], weights)
    _refused(
        stages, "weights file {root}/stage0/weights.pt does not hold a dict of named tensors; emit the stages again"
    )


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_crafted_pickle_runs_nothing(stages: Path, tmp_path: Path, how: str) -> None:
    # docs/security.md: "Checkpoints and emitted weights are read with `torch.load(weights_only=True)`"
    marker = tmp_path / "ran.txt"
    weights = stages / "stage0" / "weights.pt"
    state = {k: v for k, v in torch.load(weights, weights_only=True).items()}
    if how == "torch.save":
        torch.save({**state, "extra": _Payload(marker)}, weights)
    else:
        weights.write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(EmitError) as info:
        merge_state_dict(stages)
    assert not marker.exists()
    message = str(info.value)
    assert message.startswith(f"weights file {weights} ") and message.endswith("; emit the stages again")
    if how == "torch.save":
        assert "holds pickled objects other than tensors, refused (loading them could run code)" in message


def test_shape_and_dtype_are_checked(stages: Path) -> None:
    # docs/security.md: "Checkpoints and emitted weights are read with"
    weights = stages / "stage1" / "weights.pt"
    state = torch.load(weights, weights_only=True)
    name = next(iter(state))
    good = state[name]
    torch.save({**state, name: torch.zeros(3, 5)}, weights)
    _refused(
        stages,
        f"{{root}}/stage1/weights.pt: {name} is (3, 5) float32, the manifest says {tuple(good.shape)} float32; "
        "emit the stages again",
    )
    torch.save({**state, name: good.double()}, weights)
    _refused(
        stages,
        f"{{root}}/stage1/weights.pt: {name} is {tuple(good.shape)} float64, "
        f"the manifest says {tuple(good.shape)} float32; "
        "emit the stages again",
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m["stages"][0]["tensors"][0].pop("shape"), "stages[0].tensors[0].shape is missing"),
        (lambda m: m.pop("state_dict"), "state_dict is missing"),
        (
            lambda m: m.update(state_dict="layers.0.weight"),
            'state_dict must be a list of names (got "layers.0.weight")',
        ),
        (lambda m: m.update(stages=[1]), "stages must be a list of stage objects (got [1])"),
        (
            lambda m: m["stages"][1]["tensors"][0].update(shape=[-1]),
            "stages[1].tensors[0].shape must be a list of sizes (got [-1])",
        ),
        (
            lambda m: m["stages"][0]["tensors"][0].update(persistent="yes"),
            'stages[0].tensors[0].persistent must be true or false (got "yes")',
        ),
        (lambda m: m["stages"][0].update(weights=7), "stages[0].weights must be a file name or null (got 7)"),
        (lambda m: m.update(unused={"file": "unused.pt"}), "unused.names is missing"),
        (
            lambda m: m["stages"][0]["tensors"][1].update(dtype='q"""\n'),
            'stages[0].tensors[1].dtype must be a dtype name like float32 (got "q\\"\\"\\"\\n")',
        ),
        (
            lambda m: m["stages"][0]["tensors"][0].update(name="a\nb"),
            'stages[0].tensors[0].name must be a name (got "a\\nb")',
        ),
        (
            lambda m: m["stages"][0].update(weights="stage0/\x00.pt"),
            'stages[0].weights must be a file name or null (got "stage0/\\u0000.pt")',
        ),
        (lambda m: m["state_dict"].append("x\ry"), "state_dict must be a list of names (got ["),
    ],
)
def test_a_broken_manifest_is_one_line(stages: Path, change: Callable[[dict[str, Any]], None], message: str) -> None:
    _edit(stages, change)
    with pytest.raises(EmitError) as info:
        merge_state_dict(stages)
    text = str(info.value)
    assert text.isprintable(), text  # one line, whatever the manifest holds
    assert text.startswith(f"{stages}/manifest.json: {message}") and text.endswith("; emit the stages again"), text


def test_manifest_version(stages: Path) -> None:
    _edit(stages, lambda m: m.update(version="2"))
    _refused(stages, "{root}/manifest.json has format version '2', this autopipe reads versions 1 and 2; emit again")
    _edit(stages, lambda m: m.update(version=1))  # version 1 (no shapes of unused state) still reads
    assert merge_state_dict(stages)
    (stages / "manifest.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(EmitError, match=r"manifest.json is not a stage manifest \(not UTF-8 text\); emit the stages"):
        merge_state_dict(stages)


def test_unused_state_is_checked(tmp_path: Path) -> None:
    plan = even_plan("gpt.py", stages=2)
    model_state_keys = None
    folder = tmp_path / "gpt"
    manifest = emit(plan, folder)
    model_state_keys = manifest["state_dict"]
    assert model_state_keys
    if manifest["unused"] is None:  # make one: move a stage tensor's state into unused.pt
        st = manifest["stages"][0]
        t = next(t for t in st["tensors"] if t["persistent"] and not t["shared"])
        state = torch.load(folder / st["weights"], weights_only=True)
        torch.save({t["original"][0]: state[t["name"]]}, folder / "unused.pt")
        st["tensors"].remove(t)
        manifest["unused"] = {
            "file": "unused.pt",
            "names": t["original"],
            "tensors": [{"name": t["original"][0], "shape": [1], "dtype": t["dtype"]}],
        }
        (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EmitError, match=r"unused.pt: .* is \(.*\) float32, the manifest says \(1,\) float32"):
        merge_state_dict(folder)


def test_cli_merge_refuses_in_one_line(stages: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit(stages, lambda m: m["stages"][0].update(weights="/etc/passwd"))
    out = tmp_path / "model.pt"
    assert main(["merge", str(stages), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"autopipe: error: {stages}/manifest.json names weights file '/etc/passwd' outside the folder; "
        f"merge reads only files inside {stages}\n"
    )
    assert not out.exists()
