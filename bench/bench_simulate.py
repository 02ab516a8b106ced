# Run: python bench/bench_simulate.py [--quick]   (from the repository root, autopipe installed)
"""The simulator's core, compiled (autopipe/simulate/_simcore.c) vs its Python twin, in one
process: per action, compiling a schedule (dependency order of the ranks' lists) and simulating
one candidate (iteration time, busy time, peak memory), and K = 16 candidates in one
``simulate_many`` call, on the schedules the planner prices at scale (65,000 - 300,000 actions).
Both paths must give the same numbers (checked here too). CPU time (process_time), median of
runs; the machine may be shared.
"""

from __future__ import annotations

import platform
import random
import statistics
import sys
import time
from collections.abc import Callable

from autopipe.native import SIMULATOR, available, use_native
from autopipe.schedules import schedule_spec
from autopipe.simulate.events import StageCost, compile_lists, simulate_many, simulate_summary

CASES = [("1f1b", 64, 512, 1), ("zb-h1", 64, 1536, 1), ("interleaved-1f1b", 16, 1024, 2), ("zb-v", 32, 1024, 2)]


def cpu(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def costs(n: int, seed: int) -> list[StageCost]:
    rng = random.Random(seed)
    return [
        StageCost(
            rng.uniform(1, 2),
            rng.uniform(2, 4),
            rng.uniform(1, 2),
            rng.uniform(1, 2),
            rng.uniform(1, 9),
            rng.uniform(0, 1),
            rng.uniform(0, 1),
            rng.uniform(0, 50),
        )
        for _ in range(n)
    ]


def main() -> None:
    quick = "--quick" in sys.argv
    if not available(SIMULATOR):
        print("the C core is not built (pip install -e . with a C compiler): nothing to compare")
        return
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; CPU time per action (median)")
    for name, s, m, v in CASES[:2] if quick else CASES:
        spec = schedule_spec(name)
        lists = spec.lists(s, m, v)
        n = s * v
        cost = costs(n, 0)
        comm = [0.01] * (n - 1)
        many = [costs(n, k) for k in range(16)]
        row = {}
        results = {}
        for native in (True, False):
            use_native(native)
            reps = 5 if native else 1
            c = compile_lists(lists, s, v, spec.placement)
            actions = len(c.rank)
            row[native] = (
                cpu(lambda: compile_lists(lists, s, v, spec.placement), reps) / actions * 1e6,  # noqa: B023
                cpu(lambda: simulate_summary(c, cost, comm), reps) / actions * 1e6,  # noqa: B023
                cpu(lambda: simulate_many(c, many, [comm] * 16), reps) / actions / 16 * 1e6 if native else 0.0,  # noqa: B023
            )
            results[native] = simulate_summary(c, cost, comm)
        use_native(True)
        assert results[True] == results[False], (name, results)
        (cc, sc, mc), (cp, sp, _) = row[True], row[False]
        print(
            f"  {name:12s} S={s:3d} m={m:5d} v={v}: {actions:7d} actions; "
            f"compile {cc:.3f} us (Python {cp:.2f}, {cp / cc:.0f}x); "
            f"simulate {sc:.3f} us (Python {sp:.2f}, {sp / sc:.0f}x); "
            f"simulate_many K=16 {mc:.3f} us per action per candidate"
        )


if __name__ == "__main__":
    main()
