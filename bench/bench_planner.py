# Run: python bench/bench_planner.py   (from the repository root, autopipe installed or PYTHONPATH=.)
"""Planner speed: the full search (micro-batches x schedule x virtual stages x cuts x
recompute, all nine schedules; best-first branch and bound over simulated candidates) on synthetic
profiles of transformer-like models — 1,000 blocks into 64 stages, and 100 blocks into 8
stages — and the plan's gap to the best lower bound (these decisions have too many splits to
enumerate: the cuts are the chain solver's, then local moves).

One CPU core (the search is single-threaded Python + numpy). Prints the median of several
runs (wall and CPU time: on a shared machine CPU time is the steadier), the decision, and the
machine. ``--without v-half,v-min,dualpipe-v`` leaves schedules out of the search (to measure
what searching them costs); ``--gaps`` the gap to the lower bound with and without a memory
limit; ``--pinned`` every schedule pinned (copy this script onto another commit to compare).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import autopipe.planner.request as request
from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.planner.search import PlanRequest, lower_bound, plan_pipeline

ROOT = Path(__file__).resolve().parents[1]


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
    return Profile(
        "synthetic",
        TraceRecipe(tracer="fx", fingerprint="0"),
        "cuda: synthetic",
        "-",
        "bfloat16",
        (1, 2),
        "measured",
        tuple(blocks),
        tuple(tensors),
    )


def one_run(
    n: int, stages: int, batch: int, memory: float, recompute: str = "auto", schedule: str | None = None
) -> dict[str, object]:
    """One cold plan, timed: the profile is built first and not timed."""
    prof = synthetic_profile(n)
    req = PlanRequest(
        devices=stages,
        batch_size=batch,
        memory_limit=memory,
        link_bandwidth=50e9,
        link_latency_s=1e-5,
        recompute=recompute,
        schedule=schedule,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    plan = plan_pipeline(prof, req)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "wall": wall,
        "cpu": cpu,
        "schedule": plan.schedule,
        "virtual": plan.virtual,
        "m": plan.micro_batches,
        "recomputed": sum(s.recompute for s in plan.stages),
        "bubble": plan.bubble_fraction,
        "gap": plan.iteration_time_s / lower_bound(prof, req) - 1,
        "iteration": plan.iteration_time_s,
    }


def cold_run(one: str, without: str) -> subprocess.CompletedProcess[str]:
    """This script's ``--one ONE --without WITHOUT`` in a fresh interpreter (every cache cold)."""
    cmd = [sys.executable, __file__, "--one", one, "--without", without]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def bench(n: int, stages: int, batch: int, memory: float, repeat: int, without: str) -> None:
    """``repeat`` runs, each in a fresh interpreter: every cache (compiled schedules, the V
    schedules' built lists, the solver's memo) starts cold, as one ``autopipe plan`` does."""
    runs = []
    for _ in range(repeat):
        out = cold_run(f"{n},{stages},{batch},{memory}", without)
        out.check_returncode()
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    times, cpu, r = [float(x["wall"]) for x in runs], [float(x["cpu"]) for x in runs], runs[-1]
    virtual = f" v={r['virtual']}" if int(str(r["virtual"])) > 1 else ""
    print(
        f"{n:5d} blocks -> {stages:3d} stages, batch {batch}: median {statistics.median(times):.3f} s "
        f"(min {min(times):.3f}, max {max(times):.3f}, {repeat} cold runs; CPU median {statistics.median(cpu):.3f} s: "
        f"the machine may be shared); chose {r['schedule']}"
        f"{virtual}, m={r['m']}, "
        f"{r['recomputed']} recomputed stages, iteration {float(r['iteration']):.2f} s, "
        f"bubble {float(r['bubble']):.1%}; "
        f"{float(r['gap']):.1%} above the best lower bound"
    )


def gaps(without: str) -> None:
    """The plan's gap to the best lower bound with and without a memory limit, recomputation
    off and automatic (one cold run each)."""
    for n, stages, batch, memory in ((100, 8, 64, 8 * 2**30), (1000, 64, 512, 16 * 2**30)):
        for limit in (memory, math.inf):
            for recompute in ("auto", "never"):
                out = cold_run(f"{n},{stages},{batch},{limit},{recompute}", without)
                if out.returncode:
                    print(
                        f"{n:5d} -> {stages:3d}, memory {limit / 2**30:g} GiB, recompute {recompute}: "
                        f"{out.stderr.strip().splitlines()[-1]}"
                    )
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"{n:5d} -> {stages:3d}, memory {limit / 2**30:g} GiB, recompute {recompute}: "
                    f"{r['schedule']}, m={r['m']}, "
                    f"iteration {float(r['iteration']):.3f} s, {float(r['gap']):.1%} above the best lower bound "
                    f"(planned in {float(r['cpu']):.2f} s CPU)"
                )


def pinned(without: str) -> None:
    """Every searched schedule pinned, on each case (one cold run each, in a fresh interpreter):
    the plan's iteration time and m, and the CPU time it took. Run on two commits to compare
    what a change does to pinned plans."""
    for n, stages, batch, memory in ((100, 8, 64, 8 * 2**30), (1000, 64, 512, 16 * 2**30), (1000, 64, 512, math.inf)):
        for schedule in request.SEARCH_SCHEDULES:
            out = cold_run(f"{n},{stages},{batch},{memory},auto,{schedule}", without)
            head = f"{n:5d} -> {stages:3d}, memory {memory / 2**30:g} GiB, {schedule:16s}"
            if out.returncode:
                print(f"{head}: {out.stderr.strip().splitlines()[-1]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{head}: iteration {float(r['iteration']):.4f} s, m={r['m']} (planned in {float(r['cpu']):.2f} s CPU)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--without", default="", help="schedules to leave out of the search, comma-separated")
    parser.add_argument(
        "--one", default=None, help=argparse.SUPPRESS
    )  # n,stages,batch,memory[,recompute[,schedule]]: one timed run, JSON out
    parser.add_argument(
        "--gaps",
        action="store_true",
        help="the gap to the lower bound with and without a memory limit, recompute off and auto",
    )
    parser.add_argument(
        "--pinned", action="store_true", help="every searched schedule pinned: iteration time, m, planning time"
    )
    args = parser.parse_args()
    left_out = {x for x in args.without.split(",") if x}
    request.SEARCH_SCHEDULES = tuple(s for s in request.SEARCH_SCHEDULES if s not in left_out)  # what decisions() reads
    if args.one is not None:
        n, stages, batch, memory, *recompute = args.one.split(",")
        print(json.dumps(one_run(int(n), int(stages), int(batch), float(memory), *recompute)))
        return
    if args.gaps:
        gaps(args.without)
        return
    if args.pinned:
        pinned(args.without)
        return
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {sys.version.split()[0]}; "
        f"searching {', '.join(request.SEARCH_SCHEDULES)}"
    )
    bench(100, 8, batch=64, memory=8 * 2**30, repeat=7, without=args.without)
    bench(1000, 64, batch=512, memory=16 * 2**30, repeat=3, without=args.without)


if __name__ == "__main__":
    main()
