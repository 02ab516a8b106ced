"""The Profile file format and the affine cost fit."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from autopipe.costs.profile import Affine, ExecutorCost, Profile
from autopipe.errors import ProfileError


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_profile_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="profile file not found"):
        Profile.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match=f"^{bad} is not valid JSON"):
        Profile.load(bad)
    bad.write_text('{"version": 99}')
    with pytest.raises(
        ProfileError,
        match=f"^{bad} has profile version 99, this autopipe reads versions 1 and 2; profile the model again$",
    ):
        Profile.load(bad)
    bad.write_text('{"version": "2"}')
    with pytest.raises(ProfileError, match=f"^{bad} has profile version '2', this autopipe reads versions 1 and 2;"):
        Profile.load(bad)
    bad.write_text('{"version": 1, "blocks": []}')
    with pytest.raises(ProfileError, match=f"^{bad} is corrupt"):
        Profile.load(bad)
    with pytest.raises(
        ProfileError,
        match=f"^{tmp_path} is a directory, not a profile; give a profile written by 'autopipe profile'$",
    ):
        Profile.load(tmp_path)
    bad.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe binary")
    with pytest.raises(ProfileError, match=f"^{bad} is not a profile \\(not UTF-8 text\\); give a profile written by"):
        Profile.load(bad)


def _edited(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    raw = json.loads(_good().to_json())
    change(raw)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(raw))
    return path


def _good() -> Profile:
    block = {"intercept": 1e-5, "slope": 1e-3}
    blocks = [
        {
            "name": f"layers.{i}",
            "nodes": [f"n{i}"],
            "params": 10,
            "param_bytes": 40,
            "forward_s": block,
            "backward_s": block,
            "backward_input_s": block,
            "backward_weight_s": block,
            "saved_bytes": block,
        }
        for i in range(3)
    ]
    tensors = [{"name": f"n{i}", "src": i, "dsts": [i + 1], "bytes": block} for i in range(2)]
    raw = {
        "version": 2,
        "model": "m",
        "recipe": {"fingerprint": "fp"},
        "device": "cpu",
        "torch_version": "-",
        "dtype": "float32",
        "micro_batch_sizes": [1, 2],
        "method": "measured",
        "blocks": blocks,
        "tensors": tensors,
    }
    return Profile.from_json(json.dumps(raw))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(blocks=[], tensors=[]), " has no blocks; profile the model again"),
        (lambda r: r["blocks"][2].update(nodes=["n0"]), ": node 'n0' is in blocks 0 and 2; profile the model again"),
        (lambda r: r["blocks"][1].update(nodes=[]), ": block 1 ('layers.1') has no nodes; profile the model again"),
        (
            lambda r: r["tensors"][1].update(dsts=[7]),
            ": tensor 'n1' goes from block 1 to [7], but the blocks are 0 to 2; profile",
        ),
        (
            lambda r: r["blocks"][0]["forward_s"].update(slope=-1.0),
            ": block 0 ('layers.0') has forward_s Affine(intercept=1e-05, slope=-1.0)",
        ),
        (lambda r: r["blocks"][0]["saved_bytes"].update(slope=float("inf")), ": block 0 ('layers.0') has saved_bytes"),
        (lambda r: r.update(micro_batch_sizes=[0]), " has micro_batch_sizes [0]; they must be positive"),
        (
            lambda r: r.update(executor={"action_s": 1e-4, "send_s": -1.0}),
            " has a bad executor object (action_s 0.0001, send_s -1.0, spreads 0.0, 0.0): seconds from 0 to 10",
        ),
    ],
)
def test_a_profile_that_cannot_be_planned_is_refused_on_load(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    path = _edited(tmp_path, change)
    with pytest.raises(ProfileError) as info:
        Profile.load(path)
    assert str(info.value).startswith(f"{path}{message}"), str(info.value)


def test_blocks_are_checked_against_the_model() -> None:
    good = _good()
    model = [(b.name, b.nodes) for b in good.blocks]
    good.check_blocks(model, "p.json")
    with pytest.raises(
        ProfileError,
        match=r"^p.json has 3 blocks, the model traces into 2: block 2 'layers.2' is not in the model; profile",
    ):
        good.check_blocks(model[:2], "p.json")
    with pytest.raises(
        ProfileError,
        match=r"^p.json: block 1 holds node 'n1', which the model's block 1 \('layers.1'\) does not; profile",
    ):
        good.check_blocks([model[0], ("layers.1", ("other",)), model[2]], "p.json")
    with pytest.raises(ProfileError, match=r"^p.json has 3 blocks, the model traces into 4; profile the model again$"):
        good.check_blocks([*model, ("layers.3", ("n3",))], "p.json")


@pytest.mark.parametrize(
    ("xs", "ys", "expected"),
    [
        ([1, 2, 4], [3.0, 5.0, 9.0], Affine(1.0, 2.0)),
        ([1, 2], [2.0, 1.0], Affine(1.5, 0.0)),  # noise that slopes down: flat
        ([2, 4], [1.0, 5.0], Affine(0.0, 1.1)),  # negative intercept: refit through 0
        ([4], [8.0], Affine(0.0, 2.0)),  # one size: proportional
    ],
)
def test_affine_fit(xs: list[float], ys: list[float], expected: Affine) -> None:
    got = Affine.fit(xs, ys)
    assert got.intercept == pytest.approx(expected.intercept)
    assert got.slope == pytest.approx(expected.slope)


def test_the_executors_costs_are_kept_and_read_back() -> None:
    """Measured (issue 28): the cost per action and per send to another rank, with their spreads;
    a profile without them is written as before."""
    plain = _good()
    assert not plain.executor and "executor" not in json.loads(plain.to_json())
    cost = ExecutorCost(action_s=1.2e-4, send_s=4.4e-4, action_spread=0.05, send_spread=0.1, measured=True)
    again = Profile.from_json(dataclasses.replace(plain, executor=cost).to_json())
    assert again.executor == cost and again.executor
    with pytest.raises(ProfileError, match=r"corrupt \(TypeError: executor.send_s is '1ms', not a number\)"):
        Profile.from_json(json.dumps({**json.loads(plain.to_json()), "executor": {"send_s": "1ms"}}))
