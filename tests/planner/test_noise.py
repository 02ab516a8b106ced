"""Plans robust to the profile's measured spread (planner/noise.py): the tie rule on synthetic profiles."""

from __future__ import annotations

import dataclasses
import json
import logging
import random

import pytest

from autopipe.costs.profile import Affine, BlockCost, Profile, Spread, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.planner.noise import search_margin
from autopipe.planner.search import PlanRequest, plan_pipeline
from autopipe.plans import Plan

MIB = 2.0**20


def profile_of(times: list[float], spread: float = 0.0) -> Profile:
    """Blocks of the given forward times (seconds per sample; B twice that), each with ``spread``."""
    blocks = tuple(
        BlockCost(
            name=f"layers.{i}",
            nodes=(f"n{i}",),
            params=1000,
            param_bytes=4000,
            forward_s=Affine(0.0, t),
            backward_s=Affine(0.0, 2 * t),
            backward_input_s=Affine(0.0, t),
            backward_weight_s=Affine(0.0, t),
            saved_bytes=Affine(0.0, MIB),
            spread=Spread(spread, spread, spread, spread),
        )
        for i, t in enumerate(times)
    )
    chain = [TensorCost(f"n{i}", i, (i + 1,), Affine(0, 1e3)) for i in range(len(times) - 1)]
    tensors = (TensorCost("x", -1, (0,), Affine(0, 1e3)), *chain)
    recipe = TraceRecipe(tracer="fx", fingerprint="fp")
    return Profile("synthetic", recipe, "cpu", "-", "float32", (1,), "measured", blocks, tensors)


REQUEST = PlanRequest(devices=2, batch_size=4, memory_limit=2.0**40, micro_batches=4, schedule="1f1b")


def _noisy(base: list[float], seed: int, noise: float = 0.01) -> list[float]:
    rng = random.Random(seed)
    return [t * (1 + rng.uniform(-noise, noise)) for t in base]


def test_candidates_within_the_noise_give_one_plan_whatever_the_noise() -> None:
    """Blocks 1, 1, 0.77 ms on two devices: 1/2 and 2/1 are within 1% of each other; which is faster
    is the sampled noise's. With a 5% spread every seed gives the same plan (1/2: the lower peak
    memory, stage 0 holds two micro-batches under 1F1B) and the note names the tie."""
    base = [1e-3, 1e-3, 0.77e-3]
    blind = {plan_pipeline(profile_of(_noisy(base, seed)), REQUEST).balance for seed in range(20)}
    assert blind == {(1, 2), (2, 1)}  # without the spread the noise decides
    for seed in range(20):
        plan = plan_pipeline(profile_of(_noisy(base, seed), spread=0.05), REQUEST)
        assert plan.balance == (1, 2)
        assert plan.noise_note.startswith("within the measured noise (±")
        assert "1f1b m=4 split 1/2" in plan.noise_note and "1f1b m=4 split 2/1" in plan.noise_note
        assert plan.noise_note.split("chose ")[1].startswith("1f1b m=4 split 1/2")
        assert 0.04 < plan.uncertainty < 0.06


def test_clearly_different_candidates_give_the_faster() -> None:
    """1 + 1 | 3 is clearly faster than 1 | 1 + 3 (a spread of 2%): the faster, though it holds more."""
    for seed in range(5):
        plan = plan_pipeline(profile_of(_noisy([1e-3, 1e-3, 3e-3], seed), spread=0.02), REQUEST)
        assert plan.balance == (2, 1)
        assert plan.noise_note == ""
        assert 0.01 < plan.uncertainty < 0.03


def test_no_spread_leaves_the_plan_as_the_search_has_it() -> None:
    profile = profile_of([1e-3, 2e-3, 1e-3, 1.5e-3])
    assert search_margin(profile) == 0.0
    plan = plan_pipeline(profile, dataclasses.replace(REQUEST, micro_batches=None, schedule=None))
    assert plan.uncertainty == 0.0 and plan.noise_note == ""
    assert "±" not in plan.summary()


def test_a_tie_warns_naming_the_candidates_and_the_way_out(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="autopipe"):
        plan_pipeline(profile_of([1e-3, 1e-3, 0.77e-3], spread=0.05), REQUEST)
    (line,) = [r.getMessage() for r in caplog.records if "spread" in r.getMessage()]
    assert "too wide to rank 1f1b m=4 split 1/2 and 1f1b m=4 split 2/1" in line
    assert "--repeat" in line and "quieter machine" in line


def test_the_plan_records_and_shows_its_uncertainty() -> None:
    plan = plan_pipeline(profile_of([1e-3, 1e-3, 3e-3], spread=0.04), REQUEST)
    back = Plan.from_json(plan.to_json())
    assert back.uncertainty == plan.uncertainty > 0
    assert f"{plan.iteration_time_s * 1e3:.3f} ms ± 4%" in back.summary()


def test_plans_without_the_fields_load_and_bad_ones_say_which() -> None:
    plan = plan_pipeline(profile_of([1e-3, 1e-3, 3e-3], spread=0.04), REQUEST)
    raw = plan.to_dict()
    for key in ("uncertainty", "noise_note"):
        raw.pop(key)
    old = Plan.from_json(json.dumps(raw, default=str))
    assert old.uncertainty == 0.0 and old.noise_note == ""
    bad = plan.to_json().replace(f'"uncertainty": {plan.uncertainty}', '"uncertainty": -0.5')
    with pytest.raises(Exception, match=r"uncertainty is -0.5, expected a finite number >= 0"):
        Plan.from_json(bad)
