# Run: PYTHONPATH=. python bench/bench_overhead.py   (repository root; ~20 s)
"""The executor's own cost per action: what an F, B or W takes beyond its computation.

A GPT so small that its blocks compute next to nothing (2 layers, width 8, vocabulary 16,
sequence 4) is profiled here with one thread, planned for 2 CPU ranks with 16 micro-batches
and no overhead in the prediction, for 1F1B and ZB-H1, and trained by ``autopipe run`` (two
gloo processes, one thread each). Per action kind, the measured work (from when its messages
are in to its end, the first step left out) minus the profile's prediction is the overhead:
Python, the autograd call, posting sends. ``autopipe.planner.defaults.default_action_overhead``
quotes this script's figure for CPU ranks; ``--action-overhead`` sets yours.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TINY = ["n_layer=2", "n_embd=8", "vocab_size=16", "block_size=4"]
BATCH, MICRO_BATCHES, STEPS = 64, 16, 12
SCHEDULES = ("1f1b", "zb-h1", "interleaved-1f1b")


def main() -> None:
    from autopipe.costs.measured import profile_model
    from autopipe.model.load import load_model, parse_kwargs
    from autopipe.planner.defaults import default_link
    from autopipe.planner.search import PlanRequest, plan_pipeline
    from autopipe.runtime import RunOptions
    from autopipe.runtime.run.launch import launch
    from autopipe.runtime.run.report import compare

    torch.set_num_threads(1)
    torch.manual_seed(0)
    loaded = load_model(str(ROOT / "models" / "gpt.py"), parse_kwargs(TINY))
    prof = profile_model(loaded, micro_batch_sizes=[BATCH // MICRO_BATCHES], warmup=3, repeat=15)
    bw, lat = default_link(prof.device)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}; 2 gloo ranks x 1 thread")
    print(f"gpt {' '.join(TINY)}; batch {BATCH}, m {MICRO_BATCHES}, {STEPS} steps (first is warm-up)")
    extra: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for schedule in SCHEDULES:
            request = PlanRequest(
                devices=2,
                batch_size=BATCH,
                memory_limit=2.0**30,
                micro_batches=MICRO_BATCHES,
                schedule=schedule,
                recompute="never",
                link_bandwidth=bw,
                link_latency_s=lat,
            )
            plan = plan_pipeline(prof, request)
            path = Path(tmp) / f"plan-{schedule}.json"
            plan.save(path)
            result = launch(path, RunOptions(steps=STEPS, optimizer="SGD", lr=1e-3, timeout_s=120.0))
            for row in compare(plan, result):
                if row.unit == "s" and row.what.startswith("stage"):
                    kind = row.what.split()[-1]
                    extra.setdefault(kind, []).append(row.measured - row.predicted)
                    print(
                        f"{schedule:6s} {row.what}: measured {row.measured * 1e3:6.3f} ms, "
                        f"predicted {row.predicted * 1e3:6.3f} ms, "
                        f"extra {(row.measured - row.predicted) * 1e3:+6.3f} ms"
                    )
    every = [x for xs in extra.values() for x in xs]
    per_kind = ", ".join(f"{k} {statistics.fmean(v) * 1e3:.3f} ms" for k, v in sorted(extra.items()))
    print(f"overhead per action: {per_kind}; all {statistics.median(every) * 1e3:.3f} ms (median)")


if __name__ == "__main__":
    sys.exit(main())
