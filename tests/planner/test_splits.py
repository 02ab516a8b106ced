"""Pricing one split (``price_split``) and the search's candidates above the enumeration limit,
which are priced by it too: nothing recomputed wherever every device fits without it."""

from __future__ import annotations

import random

import pytest

import autopipe.planner.exact as exact
from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.partition.problem import evaluate
from autopipe.planner.pricing import BlockTimes, Decision, candidate, fits, price
from autopipe.planner.search import PlanRequest, plan_pipeline
from autopipe.planner.splits import plain_may_fit, price_split, problem_of, split_assignment
from tests.planner.test_exact import CHUNKED, chain

GIB = 2.0**30


def transformer(n: int) -> Profile:
    """An embedding, n - 2 layers of jittered cost and an LM head (bench/bench_planner.py's)."""
    rng = random.Random(0)
    blocks = []
    for i in range(n):
        heavy, f = 0 < i < n - 1, rng.uniform(0.9, 1.1) * (2e-3 if 0 < i < n - 1 else 1e-3)
        params = 12_600_000 if heavy else 50_000_000
        blocks.append(
            BlockCost(
                name=f"layers.{i}",
                nodes=(f"n{i}",),
                params=params,
                param_bytes=params * 2,
                forward_s=Affine(1e-4, f),
                backward_s=Affine(2e-4, 2 * f),
                backward_input_s=Affine(1e-4, f),
                backward_weight_s=Affine(1e-4, f),
                saved_bytes=Affine(0, (40 if heavy else 8) * 2**20),
            )
        )
    links = (TensorCost(f"n{i}", i, (i + 1,), Affine(0, 4 * 2**20)) for i in range(n - 1))
    tensors = (TensorCost("input", -1, (0,), Affine(0, 8192.0)), *links)
    return Profile(
        "synthetic",
        TraceRecipe(tracer="fx", fingerprint="0"),
        "cpu",
        "-",
        "bfloat16",
        (1, 2),
        "measured",
        tuple(blocks),
        tensors,
    )


@pytest.mark.parametrize(
    "name", ["gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "zb-v", "v-half", "v-min", "dualpipe-v"]
)
def test_the_screen_never_rules_out_a_split_that_fits_without_recomputation(name: str) -> None:
    """``plain_may_fit`` says False only when the simulator's peak, nothing recomputed, is over
    the limit: with the limit at that peak it must say True (random splits, S = 2..4)."""
    rng, prof, v = random.Random(name), chain(14, seed=3), CHUNKED.get(name, 1)
    for S in (2, 3, 4):
        for m in (2 * S, 3 * S, 4 * S):
            d = Decision(name, v, m)
            req = PlanRequest(devices=S, batch_size=m, memory_limit=GIB)
            p, t = problem_of(prof, req, d), BlockTimes.of(prof, 1)
            for _ in range(4):
                cuts = sorted(rng.sample(range(1, 14), S * v - 1))
                sizes = [b - a for a, b in zip([0, *cuts], [*cuts, 14], strict=True)]
                plain = candidate(d, "split", p, evaluate(p, split_assignment(sizes), (False,) * p.stages), t)
                peak = max(price(plain, S).peak_memory_bytes)
                assert plain_may_fit(p, d, S, peak, sizes), (S, m, sizes)
                assert not plain_may_fit(p, d, S, 0.5 * min(p.static_bytes), sizes)


@pytest.mark.parametrize(
    ("schedule", "gib"), [("v-min", 3.5), ("v-min", 3.8), ("zb-v", 3.5), ("interleaved-1f1b", 3.8)]
)
def test_candidates_too_many_to_enumerate_are_priced_as_price_split(
    monkeypatch: pytest.MonkeyPatch, schedule: str, gib: float
) -> None:
    """Above the enumeration limit (0 here) the solver's cuts and the simple splits are priced
    by ``price_split``: the plan is no slower than the even split priced by it (on v-min at
    3.5 GiB the even split fits without recomputation, which the per-chunk M / v rule missed),
    and pricing the plan's own split gives the plan's time."""
    monkeypatch.setattr(exact, "ENUMERATE_LIMIT", 0)
    prof = transformer(48)
    req = PlanRequest(
        devices=4,
        batch_size=16,
        memory_limit=gib * GIB,
        link_bandwidth=50e9,
        link_latency_s=1e-5,
        schedule=schedule,
        micro_batches=8,
        virtual=2,
    )
    d = Decision(schedule, 2, 8)
    _, even = price_split(prof, req, d, [6] * 8)
    plan = plan_pipeline(prof, req)
    assert fits(even, req.memory_limit)
    assert plan.iteration_time_s <= even.iteration_s * (1 + 1e-9)
    _, own = price_split(prof, req, d, list(plan.balance))
    assert own.iteration_s == pytest.approx(plan.iteration_time_s, rel=1e-12)


def test_recomputation_off_finds_the_plan_auto_finds_with_nothing_recomputed() -> None:
    """A plan "auto" makes with nothing recomputed is a plan "never" may make: above the
    enumeration limit the unlimited cuts, screened by ``plain_may_fit``, are a candidate in both
    modes (they were dropped with recomputation off: 68.5 s against 56.5 s on this case)."""
    prof = transformer(1000)
    plans = {
        rc: plan_pipeline(
            prof,
            PlanRequest(
                devices=64,
                batch_size=512,
                memory_limit=16 * GIB,
                link_bandwidth=50e9,
                link_latency_s=1e-5,
                recompute=rc,
                schedule="v-min",
                micro_batches=512,
            ),
        )
        for rc in ("auto", "never")
    }
    assert not any(s.recompute for s in plans["auto"].stages)
    assert plans["never"].iteration_time_s <= plans["auto"].iteration_time_s * (1 + 1e-12)
