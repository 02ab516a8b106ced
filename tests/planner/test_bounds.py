"""The search's bounds are below the simulator: the bound a simple split is queued by
(``split_bound``, from prefix sums alone) and the bound on what the local moves can reach from a
split (``reach_bound``), on seeded random chains, every schedule, memory tight or not."""

from __future__ import annotations

import math
import random

import pytest

from autopipe.planner.bounds import reach_bound, split_bound
from autopipe.planner.moves import LazySplit, refine
from autopipe.planner.pricing import BlockTimes, Decision
from autopipe.planner.request import PlanRequest
from autopipe.planner.splits import price_split, problem_of
from autopipe.schedules import schedule_spec
from tests.planner.test_exact import CHUNKED, chain

SCHEDULES = ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "zb-h2", "v-half", "v-min", "dualpipe-v"]


def _setup(name: str, seed: int) -> tuple[random.Random, PlanRequest, Decision, int]:
    rng = random.Random(seed)
    S, v = rng.randint(2, 4), CHUNKED.get(name, 1)
    m = (
        S * rng.choice([1, 2])
        if name == "interleaved-1f1b"
        else max(rng.choice([1, 2, S, 2 * S]), schedule_spec(name).least_micro_batches(S))
    )
    n = rng.randint(S * v + 2, 24)
    memory = rng.choice([1e18, rng.uniform(0.2, 1.5) * 2**30])
    req = PlanRequest(
        devices=S,
        batch_size=2 * m,
        memory_limit=memory,
        micro_batches=m,
        schedule=name,
        action_overhead_s=1e-4,
        link_latency_s=1e-3,
        recompute=rng.choice(["never", "auto", "always"]),
    )
    return rng, req, Decision(name, v, m), n


def _random_sizes(rng: random.Random, n: int, chunks: int) -> list[int]:
    cuts = sorted(rng.sample(range(1, n), chunks - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, n], strict=True)]


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_split_is_never_faster_than_its_bound_from_sums(name: str) -> None:
    """split_bound (from prefix sums, what a simple split is queued by) is below the bound the
    split is queued again by once summed up (moves.refine), which is below its simulated time."""
    checked = 0
    for seed in range(6):
        rng, req, d, n = _setup(name, seed)
        prof = chain(n, seed)
        problem, times = problem_of(prof, req, d), BlockTimes.of(prof, 2, req.action_overhead_s)
        for _ in range(8):
            sizes = _random_sizes(rng, n, req.devices * d.virtual)
            queued, _ = refine(prof, req, LazySplit(d, tuple(sizes), "even-layers"), problem, times)
            if queued == math.inf:  # fits no way: the search does not queue it
                continue
            _, t = price_split(prof, req, d, sizes, problem=problem, times=times)
            bound = split_bound(req, d, problem, times, sizes)
            assert bound <= queued * (1 + 1e-12) and queued <= t.iteration_s * (1 + 1e-12), (seed, sizes, req.recompute)
            checked += 1
    assert checked >= 12


@pytest.mark.parametrize("name", SCHEDULES)
def test_no_split_within_the_moves_reach_is_faster_than_the_reach_bound(name: str) -> None:
    """Walk up to ``shifts`` one-block moves (as local_moves makes them) from a random split:
    every split on the way is at least the start's reach bound."""
    for seed in range(4):
        rng, req, d, n = _setup(name, seed)
        prof = chain(n, seed)
        problem, times = problem_of(prof, req, d), BlockTimes.of(prof, 2, req.action_overhead_s)
        K = req.devices * d.virtual
        start = _random_sizes(rng, n, K)
        for shifts in (0, 1, 3):
            bound = reach_bound(req, d, start, times, shifts)
            sizes = list(start)
            for _ in range(shifts + 1):
                _, t = price_split(prof, req, d, sizes, problem=problem, times=times)
                assert bound <= t.iteration_s * (1 + 1e-12), (seed, start, sizes, shifts)
                src, dst = rng.sample(range(K), 2)
                if sizes[src] > 1:
                    sizes[src] -= 1
                    sizes[dst] += 1
