# Run: PYTHONPATH=. python bench/bench_overhead.py   (repository root; ~20 s)
"""The executor's own cost per action: what an F, B or W takes beyond its computation.

A GPT so small that its blocks compute next to nothing (2 layers, width 8, vocabulary 16,
sequence 4) is profiled here with one thread, planned for 2 CPU ranks with 16 micro-batches
and no overhead in the prediction, for 1F1B, ZB-H1 and interleaved 1F1B, and trained by
``autopipe run`` (two gloo processes, one thread each). Per action kind, the measured work (from
when its messages are in to its end, the first step left out) minus the profile's prediction is
the overhead: Python, the autograd call, posting sends. The last lines split it between the
actions that send to another rank and the others (``autopipe.simulate.sends``: the planner
prices ``action_overhead_s`` on every action and ``send_overhead_s`` on top on those that
send), and print what the profile's own probe of the executor measured (``runtime/probe.py``,
which ``autopipe plan`` prices) beside them. ``planner.defaults.default_action_overhead`` and
``default_send_overhead`` quote this script's quiet figures for CPU ranks; ``--action-overhead``
and ``--send-overhead`` set yours.
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
    from autopipe.api import executor_probe
    from autopipe.costs.measure.measured import profile_model
    from autopipe.model.load import load_model, parse_kwargs
    from autopipe.planner.defaults import default_link
    from autopipe.planner.search import PlanRequest, plan_pipeline
    from autopipe.runtime import RunOptions
    from autopipe.runtime.run.launch import launch
    from autopipe.runtime.run.report import compare
    from autopipe.simulate.sends import sends_of

    torch.set_num_threads(1)
    torch.manual_seed(0)
    loaded = load_model(str(ROOT / "models" / "gpt.py"), parse_kwargs(TINY))
    prof = profile_model(
        loaded, micro_batch_sizes=[BATCH // MICRO_BATCHES], warmup=3, repeat=15, executor=executor_probe
    )
    bw, lat = default_link(prof.device)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}; 2 gloo ranks x 1 thread")
    print(f"gpt {' '.join(TINY)}; batch {BATCH}, m {MICRO_BATCHES}, {STEPS} steps (first is warm-up)")
    extra: dict[str, list[float]] = {}
    sending: dict[bool, list[float]] = {}  # does the action send to another rank -> its extras
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
            forward, backward = sends_of([s.rank for s in plan.stages])
            for row in compare(plan, result):
                if row.unit == "s" and row.what.startswith("stage"):
                    stage, kind = int(row.what.split()[1]), row.what.split()[-1]
                    extra.setdefault(kind, []).append(row.measured - row.predicted)
                    sends = forward[stage] if kind == "F" else backward[stage] if kind == "B" else False
                    sending.setdefault(sends, []).append(row.measured - row.predicted)
                    print(
                        f"{schedule:6s} {row.what}: measured {row.measured * 1e3:6.3f} ms, "
                        f"predicted {row.predicted * 1e3:6.3f} ms, "
                        f"extra {(row.measured - row.predicted) * 1e3:+6.3f} ms"
                    )
    every = [x for xs in extra.values() for x in xs]
    per_kind = ", ".join(f"{k} {statistics.fmean(v) * 1e3:.3f} ms" for k, v in sorted(extra.items()))
    print(f"overhead per action: {per_kind}; all {statistics.median(every) * 1e3:.3f} ms (median)")
    quiet, loud = sending.get(False, [float("nan")]), sending.get(True, [float("nan")])
    print(
        f"actions that send to another rank: {statistics.median(loud) * 1e3:.3f} ms (median of {len(loud)}), "
        f"the others {statistics.median(quiet) * 1e3:.3f} ms (median of {len(quiet)}): "
        f"per action {statistics.median(quiet) * 1e3:.3f} ms, "
        f"per send on top {(statistics.median(loud) - statistics.median(quiet)) * 1e3:.3f} ms"
    )
    e = prof.executor
    if e:
        print(
            f"the profile's probe (runtime/probe.py, what autopipe plan prices): per action {e.action_s * 1e3:.3f} ms "
            f"±{e.action_spread:.0%}, per send on top {e.send_s * 1e3:.3f} ms ±{e.send_spread:.0%}"
        )
    else:
        print("the profile's probe did not run (the planner's defaults apply)")


if __name__ == "__main__":
    sys.exit(main())
