# Run: PYTHONPATH=. python bench/bench_tensor_bytes.py   (repository root; ~30 s a case on 2 idle cores)
"""Memory measured as it is predicted: each rank's peak live tensor bytes against the plan's peak.

The bundled GPT (tiny preset) and MLP are profiled here (one thread, micro-batch 2), planned for
2 CPU ranks, batch 8 in 4 micro-batches, for every schedule below with recomputation off and on
every stage, and trained for two steps by ``autopipe run`` (two gloo processes): the second step's
``peak_tensor_bytes`` (``autopipe.runtime.meters.TensorBytes``) per rank beside the plan's
``peak_memory_bytes``. Adam, as ``autopipe run``'s default, whose state the planner counts.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("gpt", "mlp")
SCHEDULES = (
    ("gpipe", 1),
    ("1f1b", 1),
    ("interleaved-1f1b", 2),
    ("zb-h1", 1),
    ("zb-h2", 1),
    ("zb-v", 2),
    ("v-half", 2),
    ("v-min", 2),
    ("dualpipe-v", 2),
)


def main() -> None:
    import autopipe
    from autopipe.runtime import RunOptions
    from autopipe.runtime.run.launch import launch

    torch.set_num_threads(1)
    only = set(sys.argv[1:])  # e.g. gpt 1f1b: those models / schedules only
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}; 2 gloo ranks x 1 thread")
    print("| model | schedule | recompute | rank | predicted MiB | measured MiB | error |")
    print("|---|---|---|---|---|---|---|")
    for model in MODELS:
        if only & set(MODELS) and model not in only:
            continue
        profile = autopipe.profile(str(ROOT / "models" / f"{model}.py"), micro_batch_sizes=(2,))
        for schedule, virtual in SCHEDULES:
            if only - set(MODELS) and schedule not in only:
                continue
            for recompute in (autopipe.Recompute.NEVER, autopipe.Recompute.ALWAYS):
                choices = autopipe.Choices(
                    schedule=schedule, virtual=virtual if virtual > 1 else None, micro_batches=4, recompute=recompute
                )
                plan = autopipe.plan_profile(profile, stages=2, batch_size=8, memory="1GiB", choices=choices)
                result = launch(plan, RunOptions(steps=2, device="cpu", timeout_s=120))
                for r in result.ranks:
                    pred, got = plan.peak_memory_bytes[r.rank], r.peak_tensor_bytes
                    print(
                        f"| {model} | {schedule} | {recompute.value} | {r.rank} | {pred / 2**20:.2f} | "
                        f"{got / 2**20:.2f} | {(got - pred) / pred:+.1%} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
