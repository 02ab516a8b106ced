"""The Profile file format and the affine cost fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autopipe.costs.profile import Affine, Profile
from autopipe.errors import ProfileError


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_profile_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="profile file not found"):
        Profile.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="profile is not valid JSON"):
        Profile.load(bad)
    bad.write_text('{"version": 99}')
    with pytest.raises(ProfileError, match="profile version 99 is not supported"):
        Profile.load(bad)
    bad.write_text('{"version": 1, "blocks": []}')
    with pytest.raises(ProfileError, match="profile is corrupt"):
        Profile.load(bad)


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
