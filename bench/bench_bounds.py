# Run: python bench/bench_bounds.py [--blocks 20000] [--stages 4096]   (repository root)
"""Scale bounds (issue 23): what the largest plans a user can ask for cost in time and memory.

Two whole commands, each in its own process (wall seconds and the child's peak resident
memory, from ``getrusage``):

- ``autopipe plan --profile`` of a synthetic profile of ``--blocks`` blocks (default 20,000:
  a profile far deeper than any model's) for 8 devices, the full search (memory unbounded: ``--memory 1TB``);
- ``autopipe show`` of a plan of ``--stages`` stages on as many devices with as many
  micro-batches (default 4,096 x 4,096: 16.8 million forward actions for 1F1B, beyond what a
  timeline can draw; ``show`` prices it in closed form and draws an elided timeline without
  materialising every action -- ``autopipe/show/draw.py`` ``MAX_DRAWN_ACTIONS``).

Neither may run away: the figures printed are what a user waits and what the machine needs.
The synthetic profiles are ``tests/planner/test_search.py``'s ``random_profile`` (seeded).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.planner.test_search import random_profile  # noqa: E402


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident MiB of ``cmd`` (this child's own, from wait4; output discarded)."""
    with tempfile.TemporaryFile() as err:  # not a pipe: a chatty child cannot fill it and stall
        start = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            said = err.read().decode(errors="replace").strip()[-400:]
            raise SystemExit(f"{' '.join(cmd[3:5])} failed ({child.returncode}): {said}")
    return wall, usage.ru_maxrss / 1024  # KiB on Linux


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=20_000, help="blocks of the profile planned (default 20000)")
    p.add_argument("--stages", type=int, default=4096, help="stages = devices = micro-batches shown (default 4096)")
    args = p.parse_args()
    exe = [sys.executable, "-m", "autopipe.cli"]
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "")
    print(f"machine: {platform.machine()} {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="bench-bounds-") as folder:
        tmp = Path(folder)
        random_profile(args.blocks, 0).save(tmp / "deep.json")
        wall, mib = timed(
            [
                *exe,
                "plan",
                "--profile",
                str(tmp / "deep.json"),
                "--devices",
                "8",
                "--memory",
                "1TB",
                "-o",
                str(tmp / "d.json"),
            ]
        )
        print(f"plan --profile ({args.blocks} blocks, 8 devices, full search): {wall:.1f} s, peak {mib:.0f} MiB")
        s = args.stages
        random_profile(s, 0).save(tmp / "wide.json")
        plan = [*exe, "plan", "--profile", str(tmp / "wide.json"), "--devices", str(s), "--micro-batches", str(s)]
        plan += ["--schedule", "1f1b", "--batch-size", str(s), "--memory", "1TB", "-o", str(tmp / "w.json")]
        wall, mib = timed(plan)
        print(
            f"plan --profile ({s} blocks, {s} devices x {s} micro-batches, 1F1B pinned): "
            f"{wall:.1f} s, peak {mib:.0f} MiB"
        )
        wall, mib = timed([*exe, "show", str(tmp / "w.json")])
        print(f"show of that plan ({s} x {s}, {2 * s * s:,} actions): {wall:.1f} s, peak {mib:.0f} MiB")


if __name__ == "__main__":
    main()
