# Run: python bench/gpu_check.py [--device cuda] [--out DIR]   (repository root; a few minutes)
"""The one short script to run when a GPU machine is lent: the CUDA paths end to end.

1. ``autopipe profile`` on the GPU (CUDA events, synchronisation, memory statistics) of a
   GPT-2-sized model;
2. ``autopipe calibrate`` of the analytic cost model against that measured profile (how far
   the catalogue's default efficiencies are from this GPU);
3. ``autopipe plan`` for one device and ``autopipe run`` of that plan on the GPU (the
   executor's CUDA placement, CUDA-event timing and ``max_memory_allocated``), measured beside
   the prediction.

With one GPU the pipeline runs as one rank (NCCL needs a GPU per rank); multi-rank NCCL needs
a machine with several. ``--device cpu`` runs the same steps on the CPU (to check the script).
Everything it prints and writes lands in ``--out``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "cuda": ["models/gpt.py", "-k", "preset=gpt2", "-k", "n_layer=6"],  # GPT-2 width, 6 layers
    "cpu": ["models/gpt.py"],  # the tiny default: GPT-2 width takes many minutes on a CPU
}


def step(title: str, args: list[str], log: Path) -> bool:
    cmd = [sys.executable, "-m", "autopipe.cli.main", *args]
    t0 = time.perf_counter()
    try:
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        code, output = result.returncode, result.stdout + result.stderr
    except subprocess.TimeoutExpired as e:
        code, output = 124, f"{e.stdout or ''}{e.stderr or ''}timed out after 300 s\n"
    text = f"$ autopipe {' '.join(args)}\n{output}(exit {code}, {time.perf_counter() - t0:.1f} s)\n"
    with log.open("a") as f:
        f.write(f"== {title}\n{text}\n")
    print(f"== {title}\n{text}", flush=True)
    return code == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", default="gpu-check", help="folder for the log and files")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    log.write_text("")
    profile, plan = out / "profile.json", out / "plan.json"
    dev = ["--device", args.device]
    ok = step(
        "profile",
        [
            "profile",
            *MODELS[args.device],
            "--batch-size",
            "8",
            "--micro-batch-sizes",
            "2,4,8",
            *dev,
            "-o",
            str(profile),
        ],
        log,
    )
    ok = ok and step("calibrate", ["calibrate", str(profile), "-o", str(out / "calibration.json")], log)
    ok = ok and step(
        "plan",
        ["plan", "--profile", str(profile), "--stages", "1", "--batch-size", "8", "--memory", "16GiB", "-o", str(plan)],
        log,
    )
    ok = ok and step("run", ["run", str(plan), "--steps", "6", *dev, "--trace", str(out / "trace.json")], log)
    print("all steps passed" if ok else "a step failed: see the log", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
