# Run: python bench/bench_analytic.py   (from the repository root, autopipe installed or PYTHONPATH=.)
"""Planning a model far larger than the machine: GPT-3 175B on 64 H100-80GB, batch 1536.

The model is built on the meta device (no weights allocated), traced, counted block by block
(FLOPs, bytes, saved bytes) and priced on the catalogue's H100 in bf16 mixed precision; then
every pipeline depth S x data-parallel width D = 64 / S is planned (cuts, micro-batches,
schedule, recomputation) and the gradient all-reduce priced. Memory per device by the stated
formula: 16 bytes per parameter held (2 bf16 weight + 2 bf16 grad + 4 fp32 master + 4 + 4 Adam;
the last stage holds a copy of the embedding its LM head is tied to),
or with ZeRO-1 (``--zero1``) 4 + 12 / D, plus the activations the schedule holds (bf16).

One CPU core (pinned when the OS allows). Prints each phase's wall time, the decision, the
runner-up, the per-stage memory check, the peak resident memory of this process and the
machine. The same plan from the command line:

    autopipe plan models/gpt.py -k preset=gpt3-175b --device h100 --gpus 64 --memory 80GB --batch-size 1536
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import torch  # noqa: E402

from autopipe.costs.analytic import BYTES_PER_PARAM, analytic_profile  # noqa: E402
from autopipe.costs.devices import device_spec  # noqa: E402
from autopipe.model.load import load_model  # noqa: E402
from autopipe.solve.parallel import Cluster, ParallelRequest, plan_parallel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GPUS, BATCH, MEMORY = 64, 1536, 80e9


def main() -> int:
    torch.set_num_threads(1)
    t_import = time.perf_counter() - T0
    spec = device_spec("h100")
    t = time.perf_counter()
    loaded = load_model(str(ROOT / "models" / "gpt.py"), {"preset": "gpt3-175b"}, device="meta")
    t_load = time.perf_counter() - t
    assert all(p.is_meta for p in loaded.model.parameters())
    params = sum(p.numel() for p in loaded.model.parameters())
    t = time.perf_counter()
    profile = analytic_profile(loaded, spec, micro_batch_sizes=(1, 2), dtype="bf16")
    t_profile = time.perf_counter() - t
    print(f"GPT-3 175B: {params / 1e9:.2f} B parameters, {profile.num_blocks} blocks; {spec.description}, bf16")
    flops = sum(b.forward_flops(1) + b.backward_flops(1) for b in profile.blocks)
    print(f"counted training FLOPs per sample (no recompute): {flops / 1e12:.1f} TFLOP")
    total = t_load + t_profile
    for zero1 in (False, True):
        request = ParallelRequest(Cluster.of(spec, GPUS), BATCH, MEMORY, bytes_per_param=BYTES_PER_PARAM, shard_optimizer=zero1)
        t = time.perf_counter()
        result = plan_parallel(profile, request)
        t_plan = time.perf_counter() - t
        plan = result.plan
        D = plan.data_parallel
        per_param = BYTES_PER_PARAM if not zero1 else 4 + (BYTES_PER_PARAM - 4) / D
        elt = sum(b.param_bytes for b in profile.blocks) / sum(b.params for b in profile.blocks)
        ok = all(  # parameters a stage holds: its own and its copy of a tied one (the LM head's)
            abs(s.static_bytes - per_param * held) <= 1e-6 * s.static_bytes + 1 and s.memory_bytes <= MEMORY
            for s in plan.stages
            for held in [s.params + sum(profile.blocks[i].shared_param_bytes for i in s.block_indices) / elt]
        )
        recomputed = sum(s.recompute for s in plan.stages)
        print(f"\n{'ZeRO-1' if zero1 else 'plain Adam'} ({per_param:.2f} bytes/parameter): planned in {t_plan:.2f} s")
        print(f"  {plan.parallel_note}")
        print(
            f"  {recomputed}/{len(plan.stages)} stages recompute; step {plan.step_time_s:.1f} s, bubble {plan.bubble_fraction:.1%}, "
            f"{plan.throughput:.2f} samples/s; peak memory {max(plan.peak_memory_bytes) / 1e9:.1f} GB of {MEMORY / 1e9:.0f} GB"
        )
        print(f"  every stage within its limit by the formula: {'yes' if ok else 'NO'}")
        print(f"  rejected: {'; '.join(f'S={r.stages} x D={r.data_parallel}' for r in result.rejected) or 'none'}")
        if not zero1:
            total += t_plan
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"\nwall: imports {t_import:.2f} s, build on meta {t_load:.2f} s, trace + count + price {t_profile:.2f} s; "
        f"load-to-plan (plain Adam) {total:.2f} s; peak resident memory {rss:.2f} GiB"
    )
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, 1 of {os.cpu_count()} cores, "
        f"Python {sys.version.split()[0]}, torch {torch.__version__}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
