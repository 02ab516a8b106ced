# Run: python bench/bench_planner.py   (from the repository root, autopipe installed or PYTHONPATH=.)
"""Planner speed: the full search (micro-batches x schedule x virtual stages x cuts x
recompute, all nine schedules; best-first branch and bound over simulated candidates) on synthetic
profiles of transformer-like models — 1,000 blocks into 64 stages, and 100 blocks into 8
stages — and the plan's gap to the best lower bound (these decisions have too many splits to
enumerate: the cuts are the chain solver's, then local moves).

One CPU core (the search is single-threaded Python + numpy). Prints the median of several
runs (wall and CPU time: on a shared machine CPU time is the steadier), the decision, and the
machine. ``--without v-half,v-min,dualpipe-v`` leaves schedules out of the search (to measure
what searching them costs).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time

import autopipe.solve.request as request
from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.solve.pricing import compiled
from autopipe.solve.search import PlanRequest, lower_bound, plan_pipeline


def synthetic_profile(n: int, seed: int = 0) -> Profile:
    """An embedding, n-2 transformer-like layers of jittered cost, and an LM head."""
    rng = random.Random(seed)
    blocks, tensors = [], [TensorCost("input", -1, (0,), Affine(0, 8192.0))]
    for i in range(n):
        heavy = 0 < i < n - 1
        f = rng.uniform(0.9, 1.1) * (2e-3 if heavy else 1e-3)
        blocks.append(
            BlockCost(
                name=f"layers.{i}",
                nodes=(f"n{i}",),
                params=12_600_000 if heavy else 50_000_000,
                param_bytes=(12_600_000 if heavy else 50_000_000) * 2,
                forward_s=Affine(1e-4, f),
                backward_s=Affine(2e-4, 2 * f),
                backward_input_s=Affine(1e-4, f),
                backward_weight_s=Affine(1e-4, f),
                saved_bytes=Affine(0, 40 * 2**20 if heavy else 8 * 2**20),
            )
        )
        if i < n - 1:
            tensors.append(TensorCost(f"n{i}", i, (i + 1,), Affine(0, 4 * 2**20)))
    return Profile("synthetic", TraceRecipe(tracer="fx", fingerprint="0"), "cuda: synthetic", "-", "bfloat16", (1, 2), "measured", tuple(blocks), tuple(tensors))


def bench(n: int, stages: int, batch: int, memory: float, repeat: int) -> None:
    prof = synthetic_profile(n)
    req = PlanRequest(devices=stages, batch_size=batch, memory_limit=memory, link_bandwidth=50e9, link_latency_s=1e-5)
    times, cpu, plan = [], [], None
    for _ in range(repeat):
        compiled.cache_clear()  # every run starts cold, as one `autopipe plan` does
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_pipeline(prof, req)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    assert plan is not None
    gap = plan.iteration_time_s / lower_bound(prof, req) - 1
    print(
        f"{n:5d} blocks -> {stages:3d} stages, batch {batch}: median {statistics.median(times):.3f} s "
        f"(min {min(times):.3f}, max {max(times):.3f}, {repeat} runs; CPU median {statistics.median(cpu):.3f} s: "
        f"the machine may be shared); chose {plan.schedule}"
        f"{f' v={plan.virtual}' if plan.virtual > 1 else ''}, m={plan.micro_batches}, "
        f"{sum(s.recompute for s in plan.stages)} recomputed stages, bubble {plan.bubble_fraction:.1%}; "
        f"{gap:.1%} above the best lower bound"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--without", default="", help="schedules to leave out of the search, comma-separated")
    args = parser.parse_args()
    left_out = {x for x in args.without.split(",") if x}
    request.SEARCH_SCHEDULES = tuple(s for s in request.SEARCH_SCHEDULES if s not in left_out)  # what decisions() reads
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, Python {sys.version.split()[0]}; "
          f"searching {', '.join(request.SEARCH_SCHEDULES)}")
    bench(100, 8, batch=64, memory=8 * 2**30, repeat=7)
    bench(1000, 64, batch=512, memory=16 * 2**30, repeat=3)


if __name__ == "__main__":
    main()
