# Run: PYTHONPATH=. python bench/bench_dualpipe_overlap.py [-k n_layer=8 n_embd=256] [--steps 8]
#   (repository root; ~1 min)
"""DualPipeV's overlapped forward-and-backward pairs on autopipe's executor: do they cost F + B?

autopipe prices a DualPipeV pair ``F(x, i)`` + ``B(y, k)`` as the two actions one after the
other on their device, their sends and receives overlapping compute (the module docstring of
``autopipe/schedules/v_shapes/dualpipe_v.py``). This measures it. models/gpt.py is profiled with one
thread, then planned for 2 CPU ranks with the schedule and m pinned: ``dualpipe-v`` and, on the
same cuts' kind (2S chunks in a V), ``zb-v``, which has no pairs. Two gloo processes (one
thread each) train both plans with autopipe's executor for ``--steps`` SGD steps (the first is
warm-up). Printed, per chunk: the median compute time of its F and of its B when run inside a
pair and when run alone (DualPipeV's warm-up, cool-down and the turn), and their ratio; the
median pair (F + B of compute) against the lone F + lone B of the same chunks; and each plan's
measured makespan against its predicted iteration time. Planning, the two ranks and their
training are bench/bench_runtime.py's (imported).

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
import statistics
import tempfile
from pathlib import Path

import torch
from bench_runtime import finish_rank, machine_line, plan_all, run_ranks, start_rank, train_plan

SCHEDULES = ("dualpipe-v", "zb-v")
MICRO_BATCHES = 8  # bench_runtime's batch of 16 in 8 micro-batches (it runs 4)


def worker(plans: list[str], steps: int, out: str) -> None:
    """One rank: every plan with autopipe's executor; each action's compute seconds."""
    from autopipe.plans import Plan

    rank = start_rank()
    results: dict[str, object] = {}
    for path in plans:
        plan = Plan.load(path)
        res = train_plan(plan, rank, steps)
        results[plan.schedule] = {
            "makespan": [it.makespan_s for it in res.iterations],
            "records": [[(r.action, r.compute_s) for r in it.records] for it in res.iterations[1:]],
        }
    finish_rank(out, results)


def report(plan_path: Path, ranks: list[dict[str, object]]) -> None:
    from autopipe.plans import Plan
    from autopipe.schedules import Action
    from autopipe.schedules.v_shapes.dualpipe_v import overlapped

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
    print(
        f"  pairs: {len(pairs)} timed; a pair's F+B compute / (lone F + lone B of the same chunks): "
        f"median {statistics.median(ratios):.2f} (quartiles {statistics.quantiles(ratios, n=4)[0]:.2f}, "
        f"{statistics.quantiles(ratios, n=4)[2]:.2f})"
    )


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
    print(machine_line(args.k, MICRO_BATCHES, args.steps))
    with tempfile.TemporaryDirectory() as tmp:
        plans = plan_all(args.k, Path(tmp), SCHEDULES, MICRO_BATCHES)
        ranks = run_ranks(__file__, args.steps, plans, Path(tmp))
        for path in plans:
            report(path, ranks)


if __name__ == "__main__":
    main()
