# Run: python bench/bench_build.py [--repeat N] [--v]   (from the repository root, autopipe installed)
"""Building schedules: microseconds per action of each schedule's integer lists
(``ScheduleSpec.lists``, the planner's path: ``create_lists``) and of its Action lists
(``create_schedule``, for people, the executor and the exporters), at the sizes the planner
prices for large models — 16 devices x 1,536 micro-batches, 64 x 512 and 64 x 1,536 (the
GPT-3 175B plan's ZB-H1 decision: ~300,000 actions).

One CPU core, CPU time (process time: steadier than wall time on a shared machine); best of
``--repeat`` runs (default 3). Prints one row per schedule and size.

``--v``: instead, milliseconds per V-Half / V-Min build (``v_block.build``: every step run, no
tiling; the planner runs four per plan, m = 2S and 2S+1 of each) at S = 16, 64, 128 and
m = 2S, in C (``_vbuild.c``) and in the Python twin.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from functools import partial

from autopipe.native import V_BUILDER, available, use_native
from autopipe.schedules import SPECS
from autopipe.schedules.v_shapes import v_block, v_half, v_min

SIZES = ((16, 1536), (64, 512), (64, 1536))


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def v_builds(repeat: int) -> None:
    """Milliseconds per V build, C and Python (see the module docstring)."""
    print(f"{'schedule':<8} {'S':>3} {'m':>4} {'C ms':>9} {'Python ms':>10} {'x':>6}")
    for S in (16, 64, 128):
        for name, module in (("v-half", v_half), ("v-min", v_min)):
            ms = []
            for native in (True, False):
                before = use_native(native)
                ms.append(best_of(partial(v_block.build, module.pattern(S), 2 * S), repeat) * 1e3)
                use_native(before)
            print(f"{name:<8} {S:>3} {2 * S:>4} {ms[0]:>9.2f} {ms[1]:>10.1f} {ms[1] / ms[0]:>6.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--schedule", action="append", help="only these (repeatable)")
    parser.add_argument("--v", action="store_true", help="V-Half / V-Min builds, C and Python")
    args = parser.parse_args()
    print(f"# {platform.python_implementation()} {platform.python_version()}, {platform.machine()}")
    if args.v:
        if not available(V_BUILDER):
            parser.error("the C extension is not built: pip install -e . with a C compiler")
        v_builds(args.repeat)
        return
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
