# Run: PYTHONPATH=. python bench/bench_prediction.py [--model gpt|mlp] [-k n_layer=8 n_embd=256] [--batch 16]
#   [--steps 10] [--repeat 9] [--cases 1f1b,zb-h1,interleaved-1f1b] [--executor measured|defaults]
#   (repository root; ~1 min)
"""Measured against predicted, per schedule, and where the difference goes.

models/gpt.py (or ``--model mlp``, models/mlp.py) is profiled here with one thread (as each
rank runs), then planned for 2 CPU ranks with the schedule and micro-batch count pinned (1F1B,
ZB-H1, interleaved 1F1B with v = 2; m = 8, batch 16), with the link and the executor's costs
per action and per send to another rank that ``autopipe plan`` uses for CPU ranks
(planner/defaults.py: the profile's probe, ``runtime/probe.py``; ``--executor defaults`` prices
bench_overhead's quiet figures instead). Each plan is run with
``autopipe.runtime.run.launch`` (two gloo processes, one thread each, as ``autopipe run``) for
``--steps`` steps; the first is warm-up.

From every action the executor records (start, when its messages had arrived, end; clocks
of one host, so comparable across ranks) the script prints, per schedule:

  * measured makespan (median over steps, slowest rank) against the plan's prediction;
  * per action kind and stage: measured compute against the plan's stage time, and the
    residual per action over the profile's block times (the executor's fixed cost per
    action, which the plan prices as ``action_overhead_s``, and per send to another rank on
    top, ``send_overhead_s``), for the actions that send and for those that do not;
  * messages between ranks per iteration and their measured latency (a consumer that waited:
    arrival minus the producer's end), against the plan's link (latency + bytes / bandwidth);
  * the simulator replayed with what was measured: measured compute and the plan's links
    (``left``: the error compute does not explain), then measured compute and measured latency,
    and the one latency per message that makes the replay land on the measurement;
  * the run report's split of the slowest rank's iteration (``runtime/run/breakdown.py``):
    compute, messages in flight and idle, predicted and measured;
  * how many receives were postable only after their message was sent (the executor posts a
    pair's operations in one agreed order, ``runtime/order.py``, and gloo moves a message only
    once its receive is posted), and how long messages took with and without that, and with
    the sender computing or not while they travelled.

What it found on the development machine is in the README (Benchmarks: "Why interleaved 1F1B
runs slower than predicted").
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

from autopipe.costs.profile import Profile
from autopipe.modes import Recompute
from autopipe.plans import Plan
from autopipe.runtime.run.breakdown import breakdown
from autopipe.runtime.run.records import RunResult
from autopipe.schedules import schedule_spec
from autopipe.schedules.action import Action, Kind
from autopipe.schedules.deps import dependencies
from autopipe.simulate.events import StageCost, simulate
from autopipe.simulate.sends import sends_of

ROOT = Path(__file__).resolve().parent.parent
CASES = (("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2))  # (schedule, virtual)
BATCH, MICRO_BATCHES, DEVICES = 16, 8, 2


def profile(
    kwargs: list[str], repeat: int = 9, model: str = "gpt", batch: int = BATCH, executor: bool = True
) -> Profile:
    """The model profiled as ``autopipe profile`` does (``executor``: with the executor's probe)."""
    from autopipe.api import executor_probe
    from autopipe.costs.measure.measured import profile_model
    from autopipe.model.load import load_model, parse_kwargs

    torch.manual_seed(0)
    loaded = load_model(str(ROOT / "models" / f"{model}.py"), parse_kwargs(kwargs))
    return profile_model(
        loaded,
        micro_batch_sizes=[batch // MICRO_BATCHES],
        warmup=min(3, repeat),
        repeat=repeat,
        executor=executor_probe if executor else None,
    )


def plan_of(prof: Profile, schedule: str, virtual: int, batch: int = BATCH) -> Plan:
    """The plan ``autopipe plan --profile`` makes with the schedule, m and recomputation pinned:
    its link, costs per action and per send (the profile's measured, else the defaults) and
    host sharing."""
    from autopipe.planner.defaults import host_shared, plan_request, with_host_sharing
    from autopipe.planner.request import Choices
    from autopipe.planner.search import plan_pipeline

    choices = Choices(MICRO_BATCHES, schedule, virtual if virtual > 1 else None, Recompute.NEVER)
    req = plan_request(prof, devices=DEVICES, batch_size=batch, memory_limit=2.0**34, choices=choices)
    shared, req, factor, spread = host_shared(prof, req)  # the ranks sharing this host, as autopipe plan prices them
    return with_host_sharing(plan_pipeline(shared, req), factor, spread)


def predicted_costs(plan: Plan) -> list[StageCost]:
    return [StageCost(s.forward_s, s.backward_s, s.backward_input_s, s.backward_weight_s, 0.0) for s in plan.stages]


def predicted_comm(plan: Plan) -> list[float]:
    return [plan.link_latency_s + s.send_bytes / plan.link_bandwidth for s in plan.stages[:-1]]


def receive_after(plan: Plan) -> dict[Action, Action | None]:
    """Per cross-rank message (named by the action that reads it): the reader rank's own action
    whose send to the same peer comes last before that message in the pair's agreed order
    (``runtime/order.py``: messages sorted by their predicted making time), or None. The
    executor posts a pair's operations strictly in that order, so it cannot post the receive
    before that action has made its send; and gloo moves a message only once its receive is
    posted (a send waits for the receiver's notice)."""
    spec = schedule_spec(plan.schedule)
    n, home = len(plan.stages), spec.devices_of(plan.devices, plan.virtual)
    schedule = spec.make(plan.devices, plan.micro_batches, plan.virtual)
    timeline = simulate(schedule, predicted_costs(plan), devices=plan.devices, placement=spec.placement)
    made = {t.action: t.end_s for t in timeline.actions}
    msgs = sorted(  # (made, producer, reader) per message between two ranks
        (made[d], d, a)
        for t in timeline.actions
        for a in [t.action]
        for d in dependencies(a, n)
        if home[d.stage] != home[a.stage]
    )
    out: dict[Action, Action | None] = {}
    for _, d, a in msgs:
        me, peer = home[a.stage], home[d.stage]
        before = [
            p for _, p, c in msgs if home[p.stage] == me and home[c.stage] == peer and (made[p], p) < (made[d], d)
        ]
        out[a] = max(before, key=lambda p: made[p]) if before else None
    return out


def analyse(prof: Profile, plan: Plan, result: RunResult) -> dict[str, float]:
    """The figures above, from ``result`` (steps after the first)."""
    spec = schedule_spec(plan.schedule)
    n, steps = len(plan.stages), range(1, result.steps)
    home = spec.devices_of(plan.devices, plan.virtual)
    compute: dict[tuple[int, str], list[float]] = {}
    latency: list[float] = []
    crossings = 0
    gate = receive_after(plan)
    late, late_wait, waits = 0, 0.0, 0.0
    after_late: list[float] = []  # waited-for messages: arrival - max(sent, receive postable)
    after_early: list[float] = []
    sender_busy: list[float] = []  # waited-for messages: arrival - sent, the sender computing most of it
    sender_idle: list[float] = []
    for k in steps:
        ends: dict[Action, float] = {}
        records = []
        busy: dict[int, list[tuple[float, float]]] = {}  # rank -> (ready, end) of its actions: computing
        for r in result.ranks:
            it = r.iterations[k]
            for rec in it.records:
                a = Action.parse(rec.action)
                assert a is not None
                ends[a] = it.start_time + rec.end_s
                records.append((a, it.start_time + rec.start_s, it.start_time + rec.ready_s))
                busy.setdefault(r.rank, []).append((it.start_time + rec.ready_s, it.start_time + rec.end_s))
                compute.setdefault((a.stage, a.kind.value), []).append(rec.compute_s)
        for a, start, ready in records:
            remote = [d for d in dependencies(a, n) if home[d.stage] != home[a.stage]]
            crossings += len(remote) if k == 1 else 0
            if not remote:
                continue
            sent, g = max(ends[d] for d in remote), gate[a]
            posted = ends[g] if g is not None else 0.0  # the receive can be posted from here on
            waits += ready - start
            if posted > sent:
                late += 1
                late_wait += ready - start
            if ready - start > 20e-6:  # it waited for its message: from both sides ready to its arrival
                latency.append(ready - sent)
                src = home[max(remote, key=lambda d: ends[d]).stage]
                computing = sum(max(0.0, min(e, ready) - max(b, sent)) for b, e in busy[src])
                (sender_busy if computing > (ready - sent) / 2 else sender_idle).append(ready - sent)
                (after_late if posted > sent else after_early).append(ready - max(sent, posted))
    med = {key: statistics.median(v) for key, v in compute.items()}
    u = plan.micro_batch_size
    share = plan.host_sharing  # the block times as the plan priced them for its ranks sharing this host
    block_f = [share * sum(prof.blocks[i].forward_s(u) for i in s.block_indices) for s in plan.stages]
    block_b = [share * sum(prof.blocks[i].backward_s(u) for i in s.block_indices) for s in plan.stages]
    fwd, bwd = Kind.FORWARD.value, Kind.BACKWARD.value
    wgt = Kind.WEIGHT.value
    w = [med.get((j, wgt), 0.0) for j in range(n)]  # zero-bubble schedules: B is the input's half
    residual = [med[(j, fwd)] - block_f[j] for j in range(n)] + [med[(j, bwd)] + w[j] - block_b[j] for j in range(n)]
    forward, backward = sends_of([s.rank for s in plan.stages])
    sending = [*forward, *backward]  # which of the residuals above are of actions that send to another rank
    with_send = [x for x, s in zip(residual, sending, strict=True) if s]
    without = [x for x, s in zip(residual, sending, strict=True) if not s]
    measured = [StageCost(med[(j, fwd)], med[(j, bwd)] + w[j], med[(j, bwd)], w[j], 0.0) for j in range(n)]
    schedule = spec.make(plan.devices, plan.micro_batches, plan.virtual)

    def replay(costs: list[StageCost], comm: list[float]) -> float:
        return simulate(schedule, costs, comm, devices=plan.devices, placement=spec.placement).iteration_s

    lat = statistics.median(latency) if latency else float("nan")
    spans = result.makespans()
    measured_span = statistics.median(spans[k] for k in steps)
    lo, hi = 0.0, 1.0  # the one latency per message that makes the replay land on the measurement
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if replay(measured, [mid] * (n - 1)) < measured_span else (lo, mid)
    return {
        "predicted": plan.iteration_time_s,
        "measured": measured_span,
        "fitted_latency": lo if replay(measured, [0.0] * (n - 1)) < measured_span else float("nan"),
        "replay_predicted": replay(predicted_costs(plan), predicted_comm(plan)),
        "replay_compute": replay(measured, predicted_comm(plan)),
        "replay_all": replay(measured, [lat] * (n - 1)),
        "actions": 2.0 * n * plan.micro_batches,
        "messages": float(crossings),
        "hops": (replay(measured, [1e-3] * (n - 1)) - replay(measured, [0.0] * (n - 1))) / 1e-3,
        "late": late / len(steps),
        "late_wait": late_wait / len(steps),
        "waits": waits / len(steps),
        "after_late": statistics.median(after_late) if after_late else float("nan"),
        "after_early": statistics.median(after_early) if after_early else float("nan"),
        "n_late": float(len(after_late)),
        "n_early": float(len(after_early)),
        "busy": statistics.median(sender_busy) if sender_busy else float("nan"),
        "idle": statistics.median(sender_idle) if sender_idle else float("nan"),
        "n_busy": float(len(sender_busy)),
        "n_idle": float(len(sender_idle)),
        "latency": lat,
        "link": statistics.fmean(predicted_comm(plan)),
        "overhead": statistics.median(residual),
        "overhead_send": statistics.median(with_send) if with_send else float("nan"),
        "overhead_other": statistics.median(without) if without else float("nan"),
        "priced_overhead": plan.action_overhead_s,
        "priced_send": plan.send_overhead_s,
        "compute_measured": sum(med[(j, fwd)] + med[(j, bwd)] + w[j] for j in range(n)) * plan.micro_batches,
        "compute_predicted": sum(s.forward_s + s.backward_s for s in plan.stages) * plan.micro_batches,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("gpt", "mlp"), default="gpt", help="models/NAME.py (default gpt)")
    ap.add_argument("-k", nargs="*", default=[], help="the model file's factory kwargs, KEY=VALUE")
    ap.add_argument("--cases", default="1f1b,zb-h1,interleaved-1f1b", help="schedules to run, comma-separated")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=BATCH, help=f"samples per iteration (default {BATCH})")
    ap.add_argument("--repeat", type=int, default=9, help="profiling: timed runs per block (the median is kept)")
    ap.add_argument(
        "--executor",
        choices=("measured", "defaults"),
        default="measured",
        help="the executor's costs per action and per send: the profile's probe (default) or planner/defaults.py's",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    from autopipe.runtime.run.launch import launch
    from autopipe.runtime.run.options import RunOptions

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}; "
        f"{DEVICES} gloo ranks x 1 thread; {args.model} {' '.join(args.k) or '(default)'}; "
        f"batch {args.batch}, m {MICRO_BATCHES}, "
        f"{args.steps} steps (first is warm-up)"
    )
    prof = profile(args.k, args.repeat, args.model, args.batch, executor=args.executor == "measured")
    rows, parts, plans = [], [], []
    for schedule, virtual in CASES:
        if schedule not in args.cases.split(","):
            continue
        plan = plan_of(prof, schedule, virtual, args.batch)
        plans.append(plan)
        result = launch(plan, RunOptions(steps=args.steps, optimizer="SGD", timeout_s=120.0))
        rows.append((f"{schedule}/v{plan.virtual}", analyse(prof, plan, result)))
        where = breakdown(plan, result, range(1, result.steps))
        assert where is not None
        parts.append((f"{schedule}/v{plan.virtual}", where))
    ms = 1e3
    print(
        f"{'schedule':20} {'predicted':>9} {'measured':>9} {'error':>7} {'replay:compute':>14} {'left':>7} "
        f"{'replay:all':>10} {'actions':>7} {'messages':>8} {'hops':>5} {'latency':>8} {'fitted':>7} {'link':>7} "
        f"{'overhead':>8} {'priced':>7} {'send':>7} {'o:send':>7} {'o:other':>7}"
    )
    for name, r in rows:
        print(
            f"{name:20} {r['predicted'] * ms:>9.2f} {r['measured'] * ms:>9.2f} "
            f"{r['measured'] / r['predicted'] - 1:>+7.1%} "
            f"{r['replay_compute'] * ms:>14.2f} {r['measured'] / r['replay_compute'] - 1:>+7.1%} "
            f"{r['replay_all'] * ms:>10.2f} {r['actions']:>7.0f} {r['messages']:>8.0f} {r['hops']:>5.1f} "
            f"{r['latency'] * ms:>8.3f} {r['fitted_latency'] * ms:>7.3f} {r['link'] * ms:>7.3f} "
            f"{r['overhead'] * ms:>8.3f} {r['priced_overhead'] * ms:>7.3f} {r['priced_send'] * ms:>7.3f} "
            f"{r['overhead_send'] * ms:>7.3f} {r['overhead_other'] * ms:>7.3f}"
        )
    print(
        "(ms. error = measured / predicted - 1. replay = the simulator with the compute measured per stage and kind, "
        "and the plan's link (:compute) or the median latency of the messages waited for (:all); left = measured / "
        "replay:compute - 1, the error compute does not explain. hops = messages on the critical path (the replay's "
        "slope in the latency per message); fitted = the latency per message at which replay:compute equals the "
        "measurement; link = the plan's. overhead = median measured action minus the profile's block time (B with "
        "its W); priced = the plan's action_overhead_s, send = its send_overhead_s (both with host sharing); "
        "o:send / o:other = the overhead of the actions that send to another rank / of the others)"
    )
    for name, r in rows:
        print(
            f"{name}: {r['late']:.1f} of {r['messages']:.0f} messages per iteration "
            "had their receive posted only after "
            f"the peer had sent them; waiting for messages {r['waits'] * ms:.2f} ms per iteration (all ranks), "
            f"{r['late_wait'] * ms:.2f} ms of it on those; of the messages waited for, those took "
            f"{r['after_late'] * ms:.2f} ms (median of {r['n_late']:.0f}) from being sent and their receive postable "
            f"to arriving, the others {r['after_early'] * ms:.2f} ms (median of {r['n_early']:.0f})"
        )
    for name, r in rows:
        print(
            f"{name}: messages waited for took {r['busy'] * ms:.2f} ms from sent to arrived when the sender was "
            f"computing most of that time (median of {r['n_busy']:.0f}), {r['idle'] * ms:.2f} ms when it was not "
            f"(median of {r['n_idle']:.0f})"
        )
    for name, r in rows:
        print(
            f"{name}: compute per iteration, all ranks: measured {r['compute_measured'] * ms:.2f} ms, "
            f"predicted {r['compute_predicted'] * ms:.2f} ms"
        )
    print("the run report's split of the slowest rank's iteration, predicted -> measured (difference), ms:")
    for name, where in parts:
        p, m, d = where.predicted, where.measured, where.difference()
        print(
            f"  {name:20} compute {p.compute_s * ms:.2f} -> {m.compute_s * ms:.2f} ({d.compute_s * ms:+.2f}), "
            f"messages {p.messages_s * ms:.2f} -> {m.messages_s * ms:.2f} ({d.messages_s * ms:+.2f}), "
            f"idle {p.idle_s * ms:.2f} -> {m.idle_s * ms:.2f} ({d.idle_s * ms:+.2f}); "
            f"iteration {p.total_s * ms:.2f} -> {m.total_s * ms:.2f} ({m.total_s / p.total_s - 1:+.1%})"
        )
    print(
        f"host sharing priced: compute x{plans[0].host_sharing:.3f} for {DEVICES} ranks "
        f"(profile's contention: {prof.contention.workers} workers -> slowdown {prof.contention.slowdown}); "
        f"printed uncertainty ±{plans[0].uncertainty:.0%}"
    )
    e = prof.executor
    said = (
        f"the profile's probe: {e.action_s * ms:.3f} ms ±{e.action_spread:.0%} / {e.send_s * ms:.3f} ms "
        f"±{e.send_spread:.0%}"
        if e
        else "planner/defaults.py's"
    )
    print(
        f"executor priced: {plans[0].action_overhead_s * ms:.3f} ms per action, "
        f"{plans[0].send_overhead_s * ms:.3f} ms per send on top (x{plans[0].host_sharing:.3f} host sharing; {said})"
    )
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
