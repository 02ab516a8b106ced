"""Profiles with error bars: the timing rounds' spread, the load average, old profiles, bad values."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from autopipe.costs.measure.timing import relative_spread
from autopipe.costs.profile import Profile, Spread
from autopipe.errors import ProfileError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OLD = FIXTURES / "good_mlp_profile_v1.json"


def test_relative_spread_is_the_iqr_over_root_n_over_the_median() -> None:
    samples = [1.0, 2.0, 3.0, 4.0, 5.0]  # quartiles 2 and 4 (inclusive), median 3
    assert relative_spread(samples) == pytest.approx(2.0 / math.sqrt(5) / 3.0)
    assert relative_spread([7.0]) == 0.0 and relative_spread([]) == 0.0
    assert relative_spread([0.0, 0.0, 0.0]) == 0.0
    assert relative_spread([2.0, 2.0, 2.0]) == 0.0


def test_relative_spread_shrinks_with_more_rounds_and_grows_with_the_noise() -> None:
    rng = random.Random(0)

    def typical(n: int, noise: float) -> float:
        return statistics.median(relative_spread([1 + rng.gauss(0, noise) for _ in range(n)]) for _ in range(200))

    assert typical(20, 0.1) < typical(5, 0.1)
    assert typical(9, 0.02) < typical(9, 0.2)
    # about the median's standard error (1.2533 sigma / sqrt(n)), within a factor of 1.5
    assert 0.7 * 1.2533 * 0.1 / 3 < typical(9, 0.1) < 1.5 * 1.2533 * 0.1 / 3


def test_old_profiles_load_with_the_spread_unknown() -> None:
    p = Profile.load(OLD)
    assert p.load_average == () and p.spread == 0.0
    assert all(b.spread == Spread() for b in p.blocks)


def test_spread_and_load_round_trip(tmp_path: Path) -> None:
    raw = json.loads(Profile.load(OLD).to_json())
    raw["blocks"][0]["spread"] = {"forward": 0.03, "backward": 0.05, "backward_input": 0.04, "backward_weight": 0.02}
    raw["load_average"] = [0.8, 1.1]
    p = Profile.from_json(json.dumps(raw))
    assert p.blocks[0].spread == Spread(0.03, 0.05, 0.04, 0.02) and p.spread == 0.05
    assert p.load_average == (0.8, 1.1)
    p.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == p


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda r: r["blocks"][1].update(spread={"forward": -0.1}),
            r"block 1 \('.*'\) has spread.forward -0.1; a spread",
        ),
        (lambda r: r["blocks"][0].update(spread={"backward": "NaN"}), r"block 0 .* has spread.backward nan; a spread"),
        (lambda r: r["blocks"][0].update(spread=[0.1]), r"is corrupt \(TypeError: a spread is list, not an object\)"),
        (lambda r: r.update(load_average=[1.0, -2.0]), r"has load_average \[1.0, -2.0\]; the load averages"),
        (lambda r: r.update(load_average=[1.0, 2.0, 3.0]), r"has load_average \[1.0, 2.0, 3.0\]; .* at most two"),
        (lambda r: r.update(load_average="high"), r"corrupt \(TypeError: load_average is 'high', not a list"),
    ],
)
def test_bad_spreads_and_loads_are_one_line(edit: object, message: str) -> None:
    raw = json.loads(Profile.load(OLD).to_json())
    edit(raw)  # type: ignore[operator]
    with pytest.raises(ProfileError, match=message) as e:
        Profile.from_json(json.dumps(raw), "p.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("p.json")
