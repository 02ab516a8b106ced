# Run: python bench/bench_lopsided.py [--rounds 3] [--runs 3] [--steps 8] [-k n_layer=12 vocab_size=8192]
#   (repository root; ~2 min a round on an idle 2-core machine)
"""The plan against the even split by layer count on a lopsided decoder, as a user runs them.

models/gpt.py with 12 layers of 128 and a heavy vocabulary head (8192 tokens, tied to the
embedding; random init): the head and its loss cost several layers, so the split that counts
layers puts most of the work on the last stage. Each round, through the command line:

  autopipe profile models/gpt.py -k ... --batch-size 16 -o profile.json
  autopipe plan --profile profile.json --devices 2 --schedule 1f1b --batch-size 16 -o plan.json
  autopipe plan --profile profile.json ... --micro-batches M --balance A,B -o even.json
      (A,B: the plan's own even-layers baseline; M: the plan's micro-batch count)
  autopipe run plan.json / even.json --steps N --optimizer SGD --device cpu --json   (--runs times each, alternating)

and prints the round's measured iterations (each run's median of the steps after the first; the
median of the runs of each) and even / plan, the measured gain, beside the predicted one. The
load average is printed with every round. A run's iteration moves by up to 10% from run to run
on this host (the head's 8192-wide logits are the largest allocation), so a round's gain is
read from the median of several runs, alternated so a change of load reaches both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL = str(ROOT / "models" / "gpt.py")
DEFAULT_K = ("n_layer=12", "n_embd=128", "n_head=4", "vocab_size=8192")
BATCH = 16


def cli(*args: str) -> str:
    cmd = [sys.executable, "-m", "autopipe.cli", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    return done.stdout


def run_iteration(plan: Path, steps: int) -> float:
    out: dict[str, Any] = json.loads(
        cli("run", str(plan), "--steps", str(steps), "--optimizer", "SGD", "--device", "cpu", "--json")
    )
    return float(out["iteration_time_s"])


def one_round(tmp: Path, k: list[str], steps: int, runs: int) -> tuple[float, float, float, float, str]:
    kw = [a for x in k for a in ("-k", x)]
    prof, plan, even = tmp / "profile.json", tmp / "plan.json", tmp / "even.json"
    cli("profile", MODEL, *kw, "--batch-size", str(BATCH), "-o", str(prof))
    common = ["--profile", str(prof), "--devices", "2", "--schedule", "1f1b", "--batch-size", str(BATCH)]
    chosen = json.loads(cli("plan", *common, "-o", str(plan), "--json"))
    m = int(chosen["micro_batches"])
    sizes = next(b["stage_blocks"] for b in chosen["baselines"] if b["name"] == "even-layers")
    balance = ",".join(str(s) for s in sizes)
    fixed = json.loads(cli("plan", *common, "--micro-batches", str(m), "--balance", balance, "-o", str(even), "--json"))
    measured: dict[str, list[float]] = {"plan": [], "even": []}
    for _ in range(runs):
        measured["plan"].append(run_iteration(plan, steps))
        measured["even"].append(run_iteration(even, steps))
    split = "/".join(str(len(s["blocks"])) for s in chosen["stages"])
    note = f"plan {split} blocks, m {m}; even {balance.replace(',', '/')}"
    mid = {side: statistics.median(xs) for side, xs in measured.items()}
    return mid["plan"], mid["even"], chosen["iteration_time_s"], fixed["iteration_time_s"], note


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", nargs="*", default=list(DEFAULT_K), help="models/gpt.py factory kwargs, KEY=VALUE")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3, help="runs of each plan per round (the median is kept)")
    args = ap.parse_args()
    print(
        f"gpt {' '.join(args.k)}; 2 CPU ranks, 1F1B, batch {BATCH}; {args.runs} runs of {args.steps} steps each per "
        "plan and round, first step left out"
    )
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            plan_s, even_s, plan_p, even_p, note = one_round(Path(tmp), args.k, args.steps, args.runs)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(
            f"round {r + 1}: {note}; measured plan {plan_s * 1e3:.1f} ms, even {even_s * 1e3:.1f} ms, "
            f"gain {even_s / plan_s:.2f}x (predicted {plan_p * 1e3:.1f} / {even_p * 1e3:.1f} ms, "
            f"{even_p / plan_p:.2f}x); load {load}",
            flush=True,
        )


if __name__ == "__main__":
    main()
