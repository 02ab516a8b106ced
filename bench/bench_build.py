# Run: python bench/bench_build.py [--repeat N]   (from the repository root, autopipe installed)
"""Building schedules: microseconds per action of each schedule's integer lists
(``ScheduleSpec.lists``, the planner's path: ``create_lists``) and of its Action lists
(``create_schedule``, for people, the executor and the exporters), at the sizes the planner
prices for large models — 16 devices x 1,536 micro-batches, 64 x 512 and 64 x 1,536 (the
GPT-3 175B plan's ZB-H1 decision: ~300,000 actions).

One CPU core, CPU time (process time: steadier than wall time on a shared machine); best of
``--repeat`` runs (default 3). Prints one row per schedule and size.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from functools import partial

from autopipe.schedules import SPECS

SIZES = ((16, 1536), (64, 512), (64, 1536))


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--schedule", action="append", help="only these (repeatable)")
    args = parser.parse_args()
    print(f"# {platform.python_implementation()} {platform.python_version()}, {platform.machine()}")
    print(f"{'schedule':<18} {'S':>3} {'m':>5} {'actions':>9} {'lists us/act':>13} {'Actions us/act':>15}")
    for spec in SPECS:
        if args.schedule and spec.name not in args.schedule:
            continue
        v = max(spec.virtual_choices)
        v = 2 if v > 2 else v
        for S, m in SIZES:
            if m < spec.least_micro_batches(S):
                continue
            n = sum(len(rows) for rows in spec.lists(S, m, v))
            lists = best_of(partial(spec.lists, S, m, v), args.repeat)
            actions = best_of(partial(spec.create_schedule, S, m, v), args.repeat)
            print(f"{spec.name:<18} {S:>3} {m:>5} {n:>9} {lists / n * 1e6:>13.3f} {actions / n * 1e6:>15.3f}")


if __name__ == "__main__":
    main()
