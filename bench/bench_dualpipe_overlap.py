# Run: PYTHONPATH=. python bench/bench_dualpipe_overlap.py [-k n_layer=8 n_embd=256] [--steps 8]   (repository root; ~1 min)
"""DualPipeV's overlapped forward-and-backward pairs on autopipe's executor: do they cost F + B?

autopipe prices a DualPipeV pair ``F(x, i)`` + ``B(y, k)`` as the two actions one after the
other on their device, their sends and receives overlapping compute (the module docstring of
``autopipe/schedules/dualpipe_v.py``). This measures it. models/gpt.py is profiled with one
thread, then planned for 2 CPU ranks with the schedule and m pinned: ``dualpipe-v`` and, on the
same cuts' kind (2S chunks in a V), ``zb-v``, which has no pairs. Two gloo processes (one
thread each) train both plans with autopipe's executor for ``--steps`` SGD steps (the first is
warm-up). Printed, per chunk: the median compute time of its F and of its B when run inside a
pair and when run alone (DualPipeV's warm-up, cool-down and the turn), and their ratio; the
median pair (F + B of compute) against the lone F + lone B of the same chunks; and each plan's
measured makespan against its predicted iteration time.

What it showed (2 CPU cores shared with other jobs, so every figure moves by tens of percent;
1 Dec 2026, torch 2.13): the default GPT, 154 pairs: a pair's F+B compute over the lone F +
lone B of the same chunks, median 1.02 (quartiles 0.84, 1.31); ``-k n_layer=8 n_embd=256 --steps
6``, 110 pairs: median 1.11 (0.82, 1.44), an F inside a pair 1.0-1.35x a lone one, a B 0.9-1.0x.
So a pair costs F + B here (no overlap gain; F perhaps slower next to the other chunk's B), as
priced. Both V plans ran far slower than predicted on the loaded machine (dualpipe-v +55% and
+124%, zb-v +64% and +161%): the load, not the pairs, since zb-v has none and is off by more.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ("dualpipe-v", "zb-v")
BATCH, MICRO_BATCHES, LR = 16, 8, 1e-3


def plan_all(kwargs: list[str], folder: Path) -> list[Path]:
    from autopipe.costs.measured import profile_model
    from autopipe.model.load import load_model, parse_kwargs
    from autopipe.solve.defaults import default_action_overhead, default_link
    from autopipe.solve.search import PlanRequest, plan_pipeline

    torch.manual_seed(0)
    loaded = load_model(str(ROOT / "models" / "gpt.py"), parse_kwargs(kwargs))
    prof = profile_model(loaded, micro_batch_sizes=[BATCH // MICRO_BATCHES], warmup=3, repeat=9)
    bw, lat = default_link(prof.device)
    paths = []
    for schedule in SCHEDULES:
        req = PlanRequest(
            devices=2, batch_size=BATCH, memory_limit=2.0**34, micro_batches=MICRO_BATCHES,
            schedule=schedule, recompute="never", link_bandwidth=bw, link_latency_s=lat,
            action_overhead_s=default_action_overhead(prof.device),
        )  # fmt: skip
        path = folder / f"plan-{schedule}.json"
        plan_pipeline(prof, req).save(path)
        paths.append(path)
    return paths


def worker(plans: list[str], steps: int, out: str) -> None:
    """One rank: every plan with autopipe's executor; each action's compute seconds."""
    import torch.distributed as dist

    from autopipe.plans import Plan
    from autopipe.runtime import RunOptions, train_rank
    from autopipe.runtime.comm import Comm, DistComm

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    results: dict[str, object] = {}
    for path in plans:
        plan = Plan.load(path)

        def comm(groups: list[tuple[int, ...]]) -> Comm:
            return DistComm(120.0, groups)

        res = train_rank(plan, rank, comm, RunOptions(steps=steps, optimizer="SGD", lr=LR, timeout_s=120.0))
        results[plan.schedule] = {
            "makespan": [it.makespan_s for it in res.iterations],
            "records": [[(r.action, r.compute_s) for r in it.records] for it in res.iterations[1:]],
        }
    Path(out).write_text(json.dumps(results))
    dist.barrier()
    os._exit(0)


def report(plan_path: Path, ranks: list[dict[str, object]]) -> None:
    from autopipe.plans import Plan
    from autopipe.schedules import Action
    from autopipe.schedules.dualpipe_v import overlapped

    plan = Plan.load(plan_path)
    per_rank = [r[plan.schedule] for r in ranks]
    spans = [max(v) for v in zip(*(r["makespan"] for r in per_rank), strict=True)][1:]  # type: ignore[call-overload]
    span, pred = statistics.median(spans) * 1e3, plan.iteration_time_s * 1e3
    print(f"{plan.schedule}: makespan {span:.2f} ms, predicted {pred:.2f} ms ({(span / pred - 1) * 100:+.1f}%)")
    if plan.schedule != "dualpipe-v":
        return
    paired: dict[tuple[int, str], list[float]] = {}
    lone: dict[tuple[int, str], list[float]] = {}
    pairs: list[tuple[str, str, float]] = []  # (F, B, their compute seconds together)
    for rank, r in enumerate(per_rank):
        in_pair = {str(a) for p in overlapped(rank, plan.devices, plan.micro_batches) for a in p}
        partner = {str(f): str(b) for f, b in overlapped(rank, plan.devices, plan.micro_batches)}
        for step in r["records"]:  # type: ignore[attr-defined]
            took = dict((a, s) for a, s in step)
            for a, s in step:
                act = Action.parse(a)
                assert act is not None
                if act.kind.value in "FB":
                    (paired if a in in_pair else lone).setdefault((act.stage, act.kind.value), []).append(s)
                if a in partner:
                    pairs.append((a, partner[a], s + took[partner[a]]))
    med = {k: statistics.median(v) * 1e3 for k, v in lone.items()}
    print(f"  {'chunk':>5} {'kind':>4} {'in a pair ms':>13} {'alone ms':>9} {'ratio':>6}")
    for key in sorted(paired):
        p = statistics.median(paired[key]) * 1e3
        alone = med.get(key)
        shown = f"{alone:>9.2f} {p / alone:>6.2f}" if alone else f"{'-':>9} {'-':>6}"
        print(f"  {key[0]:>5} {key[1]:>4} {p:>13.2f} {shown}")
    def alone(a: str) -> float:
        act = Action.parse(a)
        assert act is not None
        return med[act.stage, act.kind.value]

    ratios = [t * 1e3 / (alone(f) + alone(b)) for f, b, t in pairs]
    print(f"  pairs: {len(pairs)} timed; a pair's F+B compute / (lone F + lone B of the same chunks): "
          f"median {statistics.median(ratios):.2f} (quartiles {statistics.quantiles(ratios, n=4)[0]:.2f}, "
          f"{statistics.quantiles(ratios, n=4)[2]:.2f})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", nargs="*", default=[], help="models/gpt.py factory kwargs, KEY=VALUE")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker[1:], args.steps, args.worker[0])
        return
    torch.set_num_threads(1)
    from autopipe.runtime.launch import free_port

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"torch {torch.__version__}; 2 gloo ranks x 1 thread; gpt {' '.join(args.k) or '(default)'}; "
          f"batch {BATCH}, m {MICRO_BATCHES}, {args.steps} steps (first is warm-up)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        plans = plan_all(args.k, Path(tmp))
        port, procs = free_port(), []
        for rank in range(2):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # fmt: skip
            out = str(Path(tmp) / f"rank-{rank}.json")
            cmd = [sys.executable, __file__, "--steps", str(args.steps), "--worker", out, *map(str, plans)]
            procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT))
        if any(p.wait() for p in procs):
            sys.exit("a worker failed")
        ranks = [json.loads((Path(tmp) / f"rank-{r}.json").read_text()) for r in range(2)]
        for path in plans:
            report(path, ranks)


if __name__ == "__main__":
    main()
