# Run: python bench/bench_train.py [--steps 300]   (repository root; ~1-2 min)
"""Real training with a plan: the bundled character-level GPT on the standard library's source.

``autopipe plan models/chargpt.py`` (2 layers of 64, 32-character windows, batch 16) for 2 CPU
ranks, then ``autopipe run --steps N --optimizer Adam --lr 3e-3 --json`` once per engine
(autopipe's executor, torch.distributed.pipelining), each training on the model file's
``train_data``; and the unsplit model trained in this process on the same batches with the
same micro-batches (gradients accumulated over them, as the pipeline does). Printed per
engine: the loss at the start and at the end (mean of the last 10 steps) against ln(128), the
largest relative difference from single-process training over the first 15 steps and over
all of them (Adam turns float rounding, 1e-7, into a growing difference after a few dozen
steps: the runs agree step for step, then drift apart as two runs of one model on different
thread counts do), and the median iteration time against the plan's prediction.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "chargpt.py"
KWARGS = {"n_layer": 2, "n_embd": 64, "n_head": 4, "seq_len": 32}
BATCH, LR = 16, 3e-3


def autopipe(*args: str) -> str:
    cmd = [sys.executable, "-m", "autopipe.cli.main", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def reference(steps: int, m: int) -> list[float]:
    from autopipe.model.load import call_model, load_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    lm = load_model(str(MODEL), KWARGS)
    assert lm.make_train_data is not None
    opt = torch.optim.Adam(lm.model.parameters(), lr=LR)
    losses: list[float] = []
    for _, (x, y) in zip(range(steps), lm.make_train_data(BATCH), strict=False):
        total = 0.0
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            loss = lm.loss_fn(call_model(lm.model, xi), yi) / m
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, 1 thread per rank")
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = str(Path(tmp) / "plan.json")
        kw = [a for k, v in KWARGS.items() for a in ("-k", f"{k}={v}")]
        autopipe(
            "plan",
            str(MODEL),
            *kw,
            "--stages",
            "2",
            "--batch-size",
            str(BATCH),
            "--memory",
            "1GiB",
            "--device",
            "cpu",
            "-o",
            plan_path,
        )
        plan = json.loads(Path(plan_path).read_text())
        m = plan["micro_batches"]
        print(f"plan: {plan['schedule']}, m = {m}, predicted iteration {plan['iteration_time_s'] * 1e3:.2f} ms")
        ref = reference(args.steps, m)
        print(f"one process: loss {ref[0]:.3f} -> {statistics.mean(ref[-10:]):.3f} (ln 128 = {math.log(128):.3f})")
        for engine in ("autopipe", "torch"):
            out = autopipe(
                "run",
                plan_path,
                "--steps",
                str(args.steps),
                "--optimizer",
                "Adam",
                "--lr",
                str(LR),
                "--engine",
                engine,
                "--device",
                "cpu",
                "--json",
            )
            got = json.loads(out)
            losses = got["losses"]
            rel = [abs(a - b) / abs(b) for a, b in zip(losses, ref, strict=True)]
            print(
                f"{engine:8s} loss {losses[0]:.3f} -> {statistics.mean(losses[-10:]):.3f}; vs one process: "
                f"max rel diff {max(rel[:15]):.1e} (first 15 steps), {max(rel):.1e} (all {args.steps}); "
                f"iteration {got['iteration_time_s'] * 1e3:.2f} ms measured, "
                f"{got['predicted_iteration_time_s'] * 1e3:.2f} ms predicted"
            )


if __name__ == "__main__":
    main()
