"""The search's shortcuts change no plan: partition/reach.py's proof that no split fits (taken by
planner/search.py's ``open_infeasible`` in place of the unlimited cuts' pricing and the solver,
and by planner/exact.py's ``split_table`` in place of its floor), checked against the search
without it on seeded random requests — pipeline plans and cluster plans with their memory
choices, limits from roomy to too small — byte for byte, errors word for word."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import autopipe.planner.exact as exact
import autopipe.planner.search as search
from autopipe import api
from autopipe.costs.devices import device_spec
from autopipe.costs.profile import Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.partition.reach import cannot_fit
from autopipe.planner.parallel import Cluster, ParallelRequest, plan_parallel

ROOT = Path(__file__).resolve().parents[2]
H100 = device_spec("h100")


@pytest.fixture(scope="module")
def gpt() -> Profile:
    """GPT (8 layers, 512 wide, 512 tokens) counted for H100s in bf16."""
    counts = api.count(
        str(ROOT / "models" / "gpt.py"), {"n_layer": 8, "n_embd": 512, "n_head": 8, "block_size": 512}, H100
    )
    return api.price(counts, H100)


def _both(monkeypatch: pytest.MonkeyPatch, plan: Callable[[], str]) -> tuple[str, str, int]:
    """``plan()``'s plan JSON (or error line) with the shortcuts, then without them, and how many
    proofs the shortcuts took."""
    proofs = 0

    def counted(*args: Any) -> bool:
        nonlocal proofs
        proved = cannot_fit(*args)
        proofs += proved
        return proved

    def run() -> str:
        try:
            return plan()
        except (InfeasibleError, PlanError) as e:
            return f"{type(e).__name__}: {e}"

    with monkeypatch.context() as m:
        m.setattr(search, "cannot_fit", counted)
        m.setattr(exact, "cannot_fit", counted)
        with_them = run()
    with monkeypatch.context() as m:
        m.setattr(search, "cannot_fit", lambda *a: False)
        m.setattr(exact, "cannot_fit", lambda *a: False)
        without = run()
    return with_them, without, proofs


def _limit(profile: Profile, rng: random.Random, devices: int) -> float:
    """A limit from well below to well above the model's state and a micro-batch's activations per device."""
    whole = sum(b.param_bytes * 8 + b.saved_bytes(4) for b in profile.blocks) / devices
    return whole * rng.uniform(0.05, 3.0)


def _pipeline(profile: Profile, stages: int, batch: int, memory: float, choices: api.Choices) -> str:
    return api.plan_profile(
        profile, stages=stages, batch_size=batch, memory=memory, choices=choices, device=H100
    ).to_json()


def _cluster(profile: Profile, request: ParallelRequest) -> str:
    """The plan, its runner-up, the splits with no plan and how many the bounds skipped."""
    got = plan_parallel(profile, request)
    rejected = "\n".join(str(r) for r in got.rejected)
    return f"{got.plan.to_json()}\n{got.runner_up}\n{rejected}\n{got.pruned}"


@pytest.mark.parametrize("seed", range(3))
def test_pipeline_plans_are_the_same_without_the_shortcuts(
    gpt: Profile, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    proofs = 0
    for _ in range(4):
        stages, batch = rng.choice([2, 4, 8]), rng.choice([16, 32, 64])
        memory = _limit(gpt, rng, stages)
        choices = api.Choices(recompute=rng.choice([api.Recompute.AUTO, api.Recompute.NEVER]))
        plan = functools.partial(_pipeline, gpt, stages, batch, memory, choices)
        with_them, without, proved = _both(monkeypatch, plan)
        assert with_them == without, (stages, batch, memory)
        proofs += proved
    assert proofs > 0  # the shortcuts were taken


@pytest.mark.parametrize("seed", range(2))
def test_cluster_plans_are_the_same_without_the_shortcuts(
    gpt: Profile, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(100 + seed)
    proofs = 0
    for _ in range(3):
        gpus, batch = rng.choice([4, 8, 16]), rng.choice([32, 64])
        memory = _limit(gpt, rng, gpus // 2)
        request = ParallelRequest(Cluster.of(H100, gpus), batch, memory, host_bandwidth=H100.host_bandwidth)
        plan = functools.partial(_cluster, gpt, request)
        with_them, without, proved = _both(monkeypatch, plan)
        assert with_them == without, (gpus, batch, memory)
        proofs += proved
    assert proofs > 0
