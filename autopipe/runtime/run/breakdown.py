"""Where the iteration went, predicted and measured: compute, messages and idle.

The iteration is the slowest rank's time from the iteration start to the end of its last
action. That rank's time splits into three parts, by the same rule for the plan's simulated
timeline and for what the run recorded:

* **waiting** is the time from when an action could start on its rank (the previous action's
  end; for a measured action, when the executor began it) to when the messages it needed had
  arrived (``ActionRecord.ready_s``; the simulator's start);
* of the waiting, **idle** is the part before the producers on the other ranks had finished
  (the peer was still working), **messages** the part after (sent, not yet arrived);
* **messages** also holds what the actions spent handing their messages to another rank: in
  the plan, ``send_overhead_s`` for each F or B that sends to another rank (priced inside its
  stage time, :mod:`autopipe.simulate.sends`); in a run, what the executor recorded
  (``ActionRecord.send_s``);
* **compute** is the rest: the actions' work, and in a measured run the executor's own time
  between actions (the plan prices it as ``action_overhead_s`` inside every stage time).

So ``compute + messages + idle`` is the iteration, for each side, and the difference between
measured and predicted splits into the three differences. Measured producers' ends are read on
the same clock as the consumers' (``time.perf_counter()`` plus each rank's iteration start):
right for ranks on one host; across hosts the clocks differ and the idle / messages split of
the waiting is only as good as their agreement (a producer's end after its consumer became
ready is read as the consumer's ready time). Tests: tests/runtime/run/test_breakdown.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autopipe.plans import Plan
from autopipe.runtime.run.records import RunResult
from autopipe.schedules import Action, schedule_spec
from autopipe.schedules.deps import dependencies
from autopipe.simulate.events import StageCost
from autopipe.simulate.replay import replay
from autopipe.simulate.sends import sends_of

__all__ = ["Breakdown", "Span", "TimedAction", "breakdown", "explain", "measured_split", "predicted_split", "split"]


@dataclass(frozen=True)
class TimedAction:
    """One action on one rank, on a clock shared by all ranks (seconds)."""

    action: Action
    rank: int
    begin_s: float  # it could start on its rank (previous action's end, or the executor began it)
    ready_s: float  # its messages had arrived
    end_s: float
    send_s: float = 0.0  # of its work, handing its messages to another rank


@dataclass(frozen=True)
class Span:
    """One rank's iteration: ``compute + messages + idle`` is its time to its last action's end."""

    compute_s: float
    messages_s: float
    idle_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.messages_s + self.idle_s


@dataclass(frozen=True)
class Breakdown:
    """The slowest rank's span as predicted and as measured (mean over the measured steps)."""

    predicted: Span
    measured: Span

    def difference(self) -> Span:
        """Measured minus predicted, part by part (sums to the iteration's difference)."""
        p, m = self.predicted, self.measured
        return Span(m.compute_s - p.compute_s, m.messages_s - p.messages_s, m.idle_s - p.idle_s)


def split(actions: Iterable[TimedAction], num_stages: int, origin: dict[int, float]) -> dict[int, Span]:
    """Per rank, its span from ``origin[rank]`` (its iteration start) to its last action's end:
    the waiting of each action split at its latest producer's end on another rank, and its
    sending counted with the messages."""
    acts = list(actions)
    ends = {t.action: t.end_s for t in acts}
    rank_of = {t.action: t.rank for t in acts}
    waits: dict[int, list[float]] = {}  # rank -> [messages, idle]
    last: dict[int, float] = {}
    for t in acts:
        w = waits.setdefault(t.rank, [0.0, 0.0])
        last[t.rank] = max(last.get(t.rank, origin[t.rank]), t.end_s)
        waiting = max(0.0, t.ready_s - t.begin_s)
        remote = [ends[d] for d in dependencies(t.action, num_stages) if d in ends and rank_of[d] != t.rank]
        sent = max(remote, default=t.begin_s)
        idle = min(waiting, max(0.0, sent - t.begin_s))
        w[0] += waiting - idle + t.send_s
        w[1] += idle
    return {r: Span(last[r] - origin[r] - msg - idle, msg, idle) for r, (msg, idle) in sorted(waits.items())}


def _critical(spans: dict[int, Span]) -> Span:
    return max(spans.values(), key=lambda s: s.total_s)


def predicted_split(plan: Plan) -> Span:
    """The plan's own simulated timeline, split (its slowest rank's total is its iteration)."""
    spec = schedule_spec(plan.schedule)
    schedule = spec.create_schedule(plan.devices, plan.micro_batches, plan.virtual)
    costs = [StageCost(s.forward_s, s.backward_s, s.backward_input_s, s.backward_weight_s, 0.0) for s in plan.stages]
    comm = [  # none where the plan's sends block the sender: its stage times hold them
        plan.link_latency_s + s.send_bytes / plan.link_bandwidth if s.send_bytes > 0 and plan.overlap.p2p else 0.0
        for s in plan.stages[:-1]
    ]
    timeline = replay(schedule, costs, comm, devices=plan.devices, virtual=plan.virtual, placement=spec.placement)
    forward, backward = sends_of([s.rank for s in plan.stages])
    prev: dict[int, float] = {}
    acts = []
    for t in timeline.actions:  # by rank, in its order
        a = t.action
        sends = forward[a.stage] if a.kind == "F" else backward[a.stage] if a.kind == "B" else False
        sending = plan.send_overhead_s if sends else 0.0
        acts.append(TimedAction(a, t.rank, prev.get(t.rank, 0.0), t.start_s, t.end_s, sending))
        prev[t.rank] = t.end_s
    return _critical(split(acts, len(plan.stages), {r: 0.0 for r in range(plan.devices)}))


def measured_split(result: RunResult, num_stages: int, step: int) -> Span | None:
    """Step ``step`` as the run recorded it, split (None when no actions were recorded)."""
    acts, origin = [], {}
    for r in result.ranks:
        it = r.iterations[step]
        origin[r.rank] = it.start_time
        for rec in it.records:
            a = Action.parse(rec.action)
            if a is not None:
                t0 = it.start_time
                acts.append(TimedAction(a, r.rank, t0 + rec.start_s, t0 + rec.ready_s, t0 + rec.end_s, rec.send_s))
    if not acts:
        return None
    spans = split(acts, num_stages, origin)
    slowest = max(result.ranks, key=lambda r: r.iterations[step].makespan_s)
    return spans.get(slowest.rank, _critical(spans))


def mean_span(spans: Sequence[Span]) -> Span:
    return Span(
        statistics.fmean(s.compute_s for s in spans),
        statistics.fmean(s.messages_s for s in spans),
        statistics.fmean(s.idle_s for s in spans),
    )


def breakdown(plan: Plan, result: RunResult, steps: Iterable[int]) -> Breakdown | None:
    """Predicted and measured (mean over ``steps``) slowest-rank spans; None without records."""
    measured = [m for k in steps if (m := measured_split(result, len(plan.stages), k)) is not None]
    if not measured:
        return None
    return Breakdown(predicted_split(plan), mean_span(measured))


def explain(where: Breakdown) -> str:
    """One line for people: which part the difference mostly is, and what to do about it
    (empty when the measured iteration is within 10% of the prediction)."""
    p, m, d = where.predicted, where.measured, where.difference()
    if not p.total_s or abs(d.total_s) <= 0.1 * p.total_s:
        return ""
    parts = {"compute": d.compute_s, "messages": d.messages_s, "idle": d.idle_s}
    name = max(parts, key=lambda k: abs(parts[k]) if d.total_s < 0 else parts[k])
    if name == "compute":
        ratio = m.compute_s / p.compute_s if p.compute_s else float("inf")
        return (
            f"mostly compute: the slowest rank computed {ratio:.2f}x the profile's time (the host busier or "
            "quieter than when it was profiled, or its cores shared differently: profile and run under one load)"
        )
    if name == "messages":
        return (
            f"mostly messages: {m.messages_s * 1e3:.3f} ms sending and waiting for messages in flight against "
            f"{p.messages_s * 1e3:.3f} ms predicted (a slower link or costlier sends than planned for: "
            "plan with a larger --latency or --send-overhead)"
        )
    return "mostly idle: one rank's work took other times than planned and the other rank waited for it"
