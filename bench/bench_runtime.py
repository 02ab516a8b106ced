# Run: PYTHONPATH=. python bench/bench_runtime.py [-k n_layer=8 n_embd=256] [--steps 12]   (repository root; ~15 s)
"""autopipe's executor against torch.distributed.pipelining, and against its own prediction.

models/gpt.py is profiled here with one thread (as each rank runs), then planned for 2 CPU
ranks with the schedule and micro-batch count pinned (1F1B and GPipe, m = 4) and the
planner's default link and cost per action for CPU ranks (as ``autopipe plan`` would). Two gloo
processes (one thread each) then train each plan for ``--steps`` SGD steps with autopipe's
executor and again with ``torch.distributed.pipelining`` on the same split and schedule
(``autopipe.stages.export.to_torch_pipelining``); the first step of each is warm-up. Printed:
median iteration time of both (barrier -> optimizer step done, slowest rank), their ratio
(goal <= 1.0), and autopipe's measured schedule makespan against the plan's predicted
iteration time (goal within 15%). The default GPT's actions last a few ms, so load from other
processes on the machine moves its figures by tens of percent; ``-k n_layer=8 n_embd=256``
(20-60 ms actions) gives steadier ones.

bench/bench_dualpipe_overlap.py plans, launches and trains with this file's functions
(:func:`plan_all`, :func:`run_ranks`, :func:`start_rank`, :func:`train_plan`, :func:`finish_rank`).
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
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from autopipe.plans import Plan
    from autopipe.runtime.run.records import RunResult

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ("1f1b", "gpipe")
BATCH, MICRO_BATCHES, LR = 16, 4, 1e-3


def plan_all(
    kwargs: list[str], folder: Path, schedules: tuple[str, ...] = SCHEDULES, micro_batches: int = MICRO_BATCHES
) -> list[Path]:
    """models/gpt.py (factory ``kwargs``) profiled with one thread and planned for 2 CPU ranks per
    schedule, m pinned, with the planner's default link and costs per action and per send; the saved plans."""
    from autopipe.costs.measure.measured import profile_model
    from autopipe.model.load import load_model, parse_kwargs
    from autopipe.planner.defaults import default_action_overhead, default_link, default_send_overhead
    from autopipe.planner.search import PlanRequest, plan_pipeline

    torch.manual_seed(0)
    loaded = load_model(str(ROOT / "models" / "gpt.py"), parse_kwargs(kwargs))
    prof = profile_model(loaded, micro_batch_sizes=[BATCH // micro_batches], warmup=3, repeat=9)
    bw, lat = default_link(prof.device)
    paths = []
    for schedule in schedules:
        req = PlanRequest(
            devices=2,
            batch_size=BATCH,
            memory_limit=2.0**34,
            micro_batches=micro_batches,
            schedule=schedule,
            recompute="never",
            link_bandwidth=bw,
            link_latency_s=lat,
            action_overhead_s=default_action_overhead(prof.device),
            send_overhead_s=default_send_overhead(prof.device),
        )
        plan = plan_pipeline(prof, req)
        path = folder / f"plan-{schedule}.json"
        plan.save(path)
        paths.append(path)
    return paths


def start_rank() -> int:
    """In a worker process: one thread, this rank joins the 2-rank gloo group; its rank."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    return rank


def train_plan(plan: Plan, rank: int, steps: int) -> RunResult:
    """``steps`` SGD steps of ``plan`` on this rank with autopipe's executor."""
    from autopipe.runtime import RunOptions, train_rank
    from autopipe.runtime.comm import Comm, DistComm

    def comm(groups: list[tuple[int, ...]]) -> Comm:
        return DistComm(120.0, groups)

    return train_rank(plan, rank, comm, RunOptions(steps=steps, optimizer="SGD", lr=LR, timeout_s=120.0))


def finish_rank(out: str, results: object) -> None:
    """Save this rank's results as JSON, wait for the other rank, and exit at once."""
    import torch.distributed as dist

    Path(out).write_text(json.dumps(results))
    dist.barrier()
    os._exit(0)


def run_ranks(script: str, steps: int, plans: list[Path], folder: Path) -> list[dict[str, Any]]:
    """Start ``script --worker`` as 2 gloo ranks (one thread each) on ``plans``; what each saved."""
    from autopipe.runtime.run.launch import free_port

    port, procs = free_port(), []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
        }
        out = str(folder / f"rank-{rank}.json")
        cmd = [sys.executable, script, "--steps", str(steps), "--worker", out, *map(str, plans)]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT))
    if any(p.wait() for p in procs):
        sys.exit("a worker failed")
    return [json.loads((folder / f"rank-{r}.json").read_text()) for r in range(2)]


def machine_line(kwargs: list[str], micro_batches: int, steps: int) -> str:
    return (
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"torch {torch.__version__}; 2 gloo ranks x 1 thread; gpt {' '.join(kwargs) or '(default)'}; "
        f"batch {BATCH}, m {micro_batches}, {steps} steps (first is warm-up)"
    )


def worker(plans: list[str], steps: int, out: str) -> None:
    """One rank: every plan with autopipe's executor, then with torch.distributed.pipelining."""
    import torch.distributed as dist

    from autopipe.plans import Plan
    from autopipe.stages.export import sync_shared_grads, to_torch_pipelining
    from autopipe.stages.rebuild import rebuild_model

    rank = start_rank()
    results: dict[str, dict[str, list[float]]] = {}
    for path in plans:
        plan = Plan.load(path)
        res = train_plan(plan, rank, steps)
        mine = {
            "autopipe_step": [it.step_s for it in res.iterations],
            "autopipe_makespan": [it.makespan_s for it in res.iterations],
        }
        for it in res.iterations[1:]:  # per stage and kind: seconds of each action's work
            for rec in it.records:
                key = rec.action.split(rec.action.strip("0123456789")[-1])[0] + rec.action.strip("0123456789")[-1]
                mine.setdefault(key, []).append(rec.compute_s)
        loaded = rebuild_model(plan)
        x, y = loaded.make_inputs(plan.batch_size), loaded.make_targets(plan.batch_size)  # type: ignore[misc]
        stages, schedule = to_torch_pipelining(
            plan,
            loaded.model,
            rank,
            example_inputs=loaded.make_inputs(plan.micro_batch_size),
            loss_fn=loaded.loss_fn,
        )
        params = list({id(p): p for s in stages for p in s.submod.parameters()}.values())
        optimizer = torch.optim.SGD(params, lr=LR)
        first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
        times = []
        for _ in range(steps):
            dist.barrier()
            t0 = time.perf_counter()
            schedule.step(*((x,) if first else ()), target=y if last else None)
            sync_shared_grads(stages)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        mine["torch_step"] = times
        results[plan.schedule] = mine
    finish_rank(out, results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", nargs="*", default=[], help="models/gpt.py factory kwargs, KEY=VALUE")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker[1:], args.steps, args.worker[0])
        return
    torch.set_num_threads(1)
    from autopipe.plans import Plan

    print(machine_line(args.k, MICRO_BATCHES, args.steps))
    with tempfile.TemporaryDirectory() as tmp:
        plans = plan_all(args.k, Path(tmp))
        ranks = run_ranks(__file__, args.steps, plans, Path(tmp))
        print(
            f"{'schedule':9} {'autopipe ms':>12} {'torch ms':>9} {'ratio':>6} "
            f"{'makespan ms':>12} {'predicted ms':>13} {'error':>7}"
        )
        for path in plans:
            plan = Plan.load(path)

            def median(key: str, s: str = plan.schedule) -> float:
                per_step = zip(*(r[s][key] for r in ranks), strict=True)
                return statistics.median([max(v) for v in list(per_step)[1:]]) * 1e3

            ours, theirs, span = median("autopipe_step"), median("torch_step"), median("autopipe_makespan")
            pred = plan.iteration_time_s * 1e3
            print(
                f"{plan.schedule:9} {ours:>12.2f} {theirs:>9.2f} {ours / theirs:>6.2f} "
                f"{span:>12.2f} {pred:>13.2f} {(span / pred - 1) * 100:>+6.1f}%"
            )
            for st in plan.stages:
                got = {
                    k: statistics.median(v) * 1e3
                    for r in ranks
                    for k, v in r[plan.schedule].items()
                    if k in (f"{st.index}F", f"{st.index}B")
                }
                print(
                    f"  stage {st.index}: F {got[f'{st.index}F']:.2f} ms (predicted {st.forward_s * 1e3:.2f}), "
                    f"B {got[f'{st.index}B']:.2f} ms (predicted {st.backward_s * 1e3:.2f})"
                )


if __name__ == "__main__":
    main()
