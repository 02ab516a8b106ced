# Run: PYTHONPATH=. python bench/bench_timeline.py   (repository root; ~1 min)
"""How long ``autopipe show --timeline`` takes on the README's largest plan, and what it draws.

GPT-3 175B planned analytically for 64 H100-80GB (the README's command: S = 64, ZB-H1,
m = 1,536, 294,912 actions), then ``autopipe show plan.json --timeline t.png`` run as its own
process three times (the whole command: Python's start, imports, loading the plan, simulating
it again, drawing the text and the PNG). Also timed in-process: the simulation (replay) and the
drawing alone. Prints the picture's size in pixels and the machine.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN = [
    "plan",
    str(ROOT / "models" / "gpt.py"),
    "-k",
    "preset=gpt3-175b",
    "--device",
    "h100",
    "--gpus",
    "64",
    "--memory",
    "80GB",
    "--batch-size",
    "1536",
]


def cli(*argv: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "autopipe.cli", *argv], check=True, env=env, stdout=subprocess.DEVNULL, timeout=600
    )
    return time.perf_counter() - began


def main() -> None:
    from matplotlib.image import imread

    from autopipe.planner.assemble import plan_costs, plan_timeline
    from autopipe.plans import Plan
    from autopipe.show.draw import draw_timeline, plan_frame

    with tempfile.TemporaryDirectory() as tmp:
        plan_path, png = Path(tmp) / "g3.json", Path(tmp) / "t.png"
        planned = cli(*PLAN, "-o", str(plan_path), "--json")
        plan = Plan.load(plan_path)
        print(f"plan: {planned:.1f} s; S={plan.devices} v={plan.virtual} {plan.schedule} m={plan.micro_batches}")
        shows = [cli("show", str(plan_path), "--timeline", str(png)) for _ in range(3)]
        height, width = imread(str(png)).shape[:2]
        began = time.perf_counter()
        timeline = plan_timeline(plan)
        simulated = time.perf_counter() - began
        began = time.perf_counter()
        draw_timeline(plan, timeline, png, plan_costs(plan), plan_frame(plan, timeline))
        drawn = time.perf_counter() - began
        f = plan_frame(plan, timeline)
    print(f"actions: {len(timeline.actions):,}; drawn: {len(f.boxes):,} boxes, {sum(f.elided):,} elided")
    print(f"autopipe show --timeline (whole command): {', '.join(f'{s:.1f}' for s in shows)} s")
    print(f"in-process: simulate (replay) {simulated:.2f} s, draw {drawn:.2f} s; picture {width} x {height} px")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
