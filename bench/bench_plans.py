# Run: python bench/bench_plans.py   (from the repository root; takes about a minute)
"""Plan quality: autopipe's plan against the simple splits people use today, per model.

Each model in models/ (default size; GPT and Llama also with a 16k vocabulary, where the
embedding and LM head are large) is profiled on this machine's CPU, then planned for 2
and 4 pipeline devices (batch 32, 2 GiB per device, gloo-like link). For the schedule and
micro-batch count autopipe chose, the same simulator prices three baselines: the even split
by layer count (by blocks), the split balancing parameter counts (DeepSpeed's "parameters"
method), and a greedy split by time. Ratios > 1 mean the baseline's iteration is slower.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch

from autopipe.costs.measure.measured import profile_model
from autopipe.model.load import check_model_runs, load_model
from autopipe.planner.defaults import default_action_overhead, default_link, default_send_overhead
from autopipe.planner.search import PlanRequest, plan_pipeline

MODELS = Path(__file__).resolve().parent.parent / "models"


def main() -> None:
    torch.set_num_threads(1)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"torch {torch.__version__}, 1 thread"
    )
    print(
        f"{'model':10} {'S':>2} {'schedule':18} {'m':>3} {'autopipe ms':>12} "
        f"{'even-layers':>12} {'by-params':>10} {'greedy-time':>12}"
    )
    cases = [
        ("gpt", {}),
        ("gpt", {"vocab_size": 16384}),
        ("llama", {}),
        ("llama", {"vocab_size": 16384}),
        ("resnet", {}),
        ("unet", {}),
        ("mlp", {}),
    ]
    for name, kwargs in cases:
        torch.manual_seed(0)
        loaded = load_model(str(MODELS / f"{name}.py"), kwargs)
        name = name + ("-16k" if kwargs else "")
        check_model_runs(loaded, 8)
        prof = profile_model(loaded, micro_batch_sizes=[2, 4, 8], warmup=2, repeat=7)
        bw, lat = default_link(prof.device)
        for stages in (2, 4):
            req = PlanRequest(
                devices=stages,
                batch_size=32,
                memory_limit=2 * 2**30,
                link_bandwidth=bw,
                link_latency_s=lat,
                action_overhead_s=default_action_overhead(prof.device),
                send_overhead_s=default_send_overhead(prof.device),
            )
            plan = plan_pipeline(prof, req)
            ratio = {b.name: b.iteration_time_s / plan.iteration_time_s for b in plan.baselines}
            fits = {b.name: "" if b.fits else "*" for b in plan.baselines}
            sched = plan.schedule + (f"/v{plan.virtual}" if plan.virtual > 1 else "")
            print(
                f"{name:10} {stages:>2} {sched:18} {plan.micro_batches:>3} {plan.iteration_time_s * 1e3:>12.2f} "
                + " ".join(
                    f"{ratio[k]:>{w}.2f}x{fits[k]}"
                    for k, w in (("even-layers", 11), ("by-params", 9), ("greedy-time", 11))
                )
            )
    print("(* = that split does not fit the memory limit)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
