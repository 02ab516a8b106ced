# Run: python bench/bench_solver.py   (from the repository root, autopipe installed or PYTHONPATH=.)
"""Times the partition solvers on seeded random chains (with skip tensors and memory limits).

solve_fast on 1000 blocks x 64 stages, solve_chain on 100 and 200 blocks x 8 and 16 stages;
prints the median of several runs, each on a fresh copy of the problem (nothing kept from
the run before), and the machine.
"""

from __future__ import annotations

import math
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

from autopipe.partition import Edge, PartitionProblem, solve_chain, solve_fast


def random_chain(n: int, stages: int, seed: int, recompute: str = "auto") -> PartitionProblem:
    """A chain of n blocks with a few skip tensors, 1F1B in-flight counts and a memory limit
    that forces some recomputation."""
    rng = random.Random(seed)
    tensors = [Edge(-1, (0,), 4e6)]
    tensors += [Edge(i, (i + 1,), rng.uniform(2e6, 8e6)) for i in range(n - 1)]
    for _ in range(n // 10):
        a = rng.randrange(n - 1)
        tensors.append(Edge(a, (min(n - 1, a + rng.randint(2, 20)),), rng.uniform(1e6, 4e6)))
    static = tuple(rng.uniform(1e8, 3e8) for _ in range(n))
    act = tuple(rng.uniform(5e7, 2e8) for _ in range(n))
    inflight = tuple(float(stages - s) for s in range(stages))
    # roughly: an even split with all activations held at stage 0 would need 1.3x this limit
    limit = (sum(static) + stages * sum(act)) / stages / 1.3
    return PartitionProblem(
        time_s=tuple(rng.uniform(1e-3, 3e-3) for _ in range(n)),
        recompute_s=tuple(rng.uniform(3e-4, 1e-3) for _ in range(n)),
        static_bytes=static,
        activation_bytes=act,
        tensors=tuple(tensors),
        stages=stages,
        inflight=inflight,
        stage_memory_limit=(limit,) * stages,
        link_latency_s=2e-5,
        link_bandwidth=2.5e10,
        recompute=recompute,
    )


def fresh(p: PartitionProblem) -> PartitionProblem:
    """``p`` with new per-block tuples: the solvers keep answers and tables per set of blocks
    (by identity), which a repeated run would only look up."""
    return replace(
        p,
        **{
            f: tuple(list(getattr(p, f)))
            for f in ("time_s", "recompute_s", "static_bytes", "activation_bytes", "tensors")
        },
    )


def median_time(fn: Callable[[PartitionProblem], object], problem: PartitionProblem, runs: int) -> float:
    fn(fresh(problem))  # warm up (imports)
    samples = []
    for p in [fresh(problem) for _ in range(runs)]:
        t0 = time.perf_counter()
        fn(p)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    cases: list[tuple[str, Callable[[PartitionProblem], object], int, int]] = [
        ("solve_fast", solve_fast, 1000, 64),
        ("solve_chain", solve_chain, 100, 8),
        ("solve_chain", solve_chain, 200, 16),
    ]
    for name, solver, n, stages in cases:
        for mode in ("never", "auto"):
            problem = random_chain(n, stages, seed=0, recompute=mode)
            result = solver(problem)
            assert isinstance(result, object)
            sec = median_time(solver, problem, runs=7)
            z = getattr(result, "bottleneck_s", math.nan)
            print(
                f"{name:11s} {n:5d} blocks x {stages:3d} stages, recompute={mode:5s}: "
                f"median {sec * 1e3:8.2f} ms  (Z = {z * 1e3:.3f} ms)"
            )


if __name__ == "__main__":
    main()
