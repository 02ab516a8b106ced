# Run: python bench/bench_analytic.py [--1t]   (from the repository root, autopipe installed or PYTHONPATH=.)
"""Planning models far larger than the machine: GPT-3 175B on 64 H100-80GB (batch 1536), and
with ``--1t`` the Megatron-LM paper's 1T row (Narayanan et al. 2021, Table 1: 128 layers,
width 25,600, 160 heads, 2,048 tokens, vocabulary 51,200; batch 3,072 on 3,072 A100-80GB).

The model is built on the meta device (no weights allocated), traced, counted block by block
(FLOPs, bytes, saved bytes; its identical layers as a copy with three, ``costs.deepen``) and
priced in bf16 mixed precision; then the full 3D search:
every tensor-parallel degree t (dividing the 8 GPUs of a node and the heads), pipeline depth S
and data-parallel width D = G / (t S), each with the shardings of the state over the replicas
(none, ZeRO-1, -2, -3, hybrid over a node's replicas: ``planner/placement.py``), cuts,
micro-batches, schedule and recomputation, the data-parallel collectives priced, the
tensor-parallel collectives over NVLink (``costs/tensor.py``, with sequence parallelism); once
as autopipe's executor runs (nothing overlapped but the pipeline sends), once for Megatron-LM
(1F1B and interleaved only, and its overlaps: gradient reduction and parameter gather under the
backward and forward). For 175B it also runs the S x D search (t = 1) in plain Adam and with
ZeRO-1 pinned. Memory per device by the ZeRO paper's formulas: 16 bytes per parameter held
whole (2 bf16 weight + 2 bf16 grad + 4 fp32 master + 4 + 4 Adam; the last stage holds a copy of
the embedding its LM head is tied to), ZeRO-1 4 + 12 / N, ZeRO-2 2 + 14 / N, ZeRO-3 16 / N over
N replicas, plus the activations the schedule holds (bf16).

One CPU core (pinned when the OS allows). Prints each phase's wall and CPU time (CPU time is
what a quiet machine's wall time would be; the two differ on a shared one), each (t, S, D)
pipeline search's CPU time, the decision, the runner-up, the per-stage memory check and the
peak resident memory. From the command line:

    autopipe plan models/gpt.py -k preset=gpt3-175b --device h100 --gpus 64 --memory 80GB --batch-size 1536
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from pathlib import Path

T0, C0 = time.perf_counter(), time.process_time()
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import torch  # noqa: E402

from autopipe.costs.analytic import BYTES_PER_PARAM, count_model, profile_from_counts  # noqa: E402
from autopipe.costs.devices import device_spec  # noqa: E402
from autopipe.model.load import load_model  # noqa: E402
from autopipe.modes import Sharding  # noqa: E402
from autopipe.planner.cluster import target_overlap, tensor_options  # noqa: E402
from autopipe.planner.parallel import Cluster, ParallelRequest, plan_parallel  # noqa: E402
from autopipe.planner.placement import state_bytes  # noqa: E402
from autopipe.planner.request import Choices  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GPT3 = {"preset": "gpt3-175b"}
ONE_T = {"preset": "gpt3-175b", "n_layer": 128, "n_embd": 25600, "n_head": 160, "vocab_size": 51200}


class PerSplit:
    """CPU seconds of each (t, S, D) pipeline search, from ``plan_parallel``'s progress calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.current, self.since = "", time.process_time()

    def __call__(self, what: str, done: int, total: int) -> None:
        split = what.split(":")[0]
        now = time.process_time()
        if self.current:
            self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self.since
        self.current, self.since = split, now

    def close(self) -> str:
        self("", 0, 0)
        return ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items())


class Clock:
    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        w, c = time.perf_counter(), time.process_time()
        out = (w - self.wall, c - self.cpu)
        self.wall, self.cpu = w, c
        return out


def run(name: str, kwargs: dict[str, object], device: str, gpus: int, batch: int, memory: float, today: bool) -> None:
    spec = device_spec(device)
    clock = Clock()
    loaded = load_model(str(ROOT / "models" / "gpt.py"), kwargs, device="meta")
    assert all(p.is_meta for p in loaded.model.parameters())
    params = sum(p.numel() for p in loaded.model.parameters())
    counts = count_model(loaded, micro_batch_sizes=(1, 2), dtype="bf16", shallow=True)
    profile = profile_from_counts(counts, spec)
    t_count = clock.lap()
    print(
        f"\n{name}: {params / 1e9:.1f} B parameters, {profile.num_blocks} blocks; "
        f"{gpus} x {spec.description}, bf16, batch {batch}"
    )
    print(f"  build on meta + trace + count + price: {t_count[0]:.2f} s wall, {t_count[1]:.2f} s CPU")
    cluster = Cluster.of(spec, gpus)
    cases = [
        ("3D search (t x S x D x sharding)", None, True, "autopipe"),
        ("3D search for Megatron-LM (its schedules, its overlaps)", None, True, "megatron"),
    ] + (
        [
            ("t = 1 only (S x D), plain Adam", Sharding.NONE, False, "autopipe"),
            ("t = 1 only, ZeRO-1", Sharding.ZERO1, False, "autopipe"),
        ]
        if today
        else []
    )
    for label, sharding, with_tensor, target in cases:
        request = ParallelRequest(
            cluster,
            batch,
            memory,
            bytes_per_param=BYTES_PER_PARAM,
            sharding=sharding,
            choices=Choices(target=target),
            host_bandwidth=spec.host_bandwidth,
        )
        clock.lap()
        overlap = target_overlap(target)
        tensor = tensor_options(counts, spec, cluster, True, overlap.tp_comm) if with_tensor else None
        splits = PerSplit()
        result = plan_parallel(profile, request, tensor=tensor, progress=splits)
        t_plan = clock.lap()
        searched = splits.close()
        plan = result.plan
        D, t = plan.data_parallel, plan.tensor_parallel
        per_param = state_bytes(plan.sharding, plan.shard_group or D, BYTES_PER_PARAM, 2.0)
        ok = all(s.memory_bytes <= memory for s in plan.stages)
        gpu = plan.model_flops / plan.step_time_s / gpus / 1e12, plan.hardware_flops / plan.step_time_s / gpus / 1e12
        recomputed = sum(s.recompute for s in plan.stages)
        shards = f" over {plan.shard_group} of {D}" if plan.shard_group else ""
        print(f"  {label}: planned in {t_plan[0]:.2f} s wall, {t_plan[1]:.2f} s CPU")
        print(
            f"    sharding {plan.sharding}{shards} ({per_param:.2f} bytes/parameter), overlapped: "
            f"{plan.overlap.describe()}; data-parallel collectives {plan.dp_comm_s:.3f} s a step, "
            f"{plan.allreduce_s:.3f} s past the pipeline"
        )
        print(f"    {plan.parallel_note}")
        print(f"    pipeline searches (CPU, in the order opened): {searched}")
        print(
            f"    t={t} p={plan.devices} d={D} vpp={plan.virtual} micro-batch {plan.micro_batch_size}; "
            f"{recomputed}/{len(plan.stages)} stages recompute"
            f"{f', every layer: {plan.memory_choice}' if plan.memory_choice else ''}; step {plan.step_time_s:.1f} s, "
            f"bubble {plan.bubble_fraction:.1%}; {gpu[0]:.0f} model TFLOP/s per GPU "
            f"({gpu[1]:.0f} hardware); peak memory {max(plan.peak_memory_bytes) / 1e9:.1f} GB of "
            f"{memory / 1e9:.0f} GB, within the limit: {'yes' if ok else 'NO'}; "
            f"{result.pruned} splits pruned "
            "(their bound, or their search against the runner-up)"
        )
        if with_tensor and target == "autopipe":
            print(
                f"  end to end (build, count, 3D plan): {t_count[0] + t_plan[0]:.2f} s wall, "
                f"{t_count[1] + t_plan[1]:.2f} s CPU"
            )


def main() -> int:
    torch.set_num_threads(1)
    print(f"imports: {time.perf_counter() - T0:.2f} s wall, {time.process_time() - C0:.2f} s CPU")
    if "--1t" in sys.argv:
        run("Megatron-LM 1T (Narayanan et al. 2021, Table 1)", ONE_T, "a100-80gb", 3072, 3072, 80e9, today=False)
    else:
        run("GPT-3 175B", GPT3, "h100", 64, 1536, 80e9, today=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"\npeak resident memory {rss:.2f} GiB; total {time.perf_counter() - T0:.2f} s wall, "
        f"{time.process_time() - C0:.2f} s CPU"
    )
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, 1 of {os.cpu_count()} cores, "
        f"Python {sys.version.split()[0]}, torch {torch.__version__}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
