"""Measured against predicted: what the run did beside what the plan said it would do.

Per stage: mean forward and backward time per micro-batch (B and W apart for zero-bubble
schedules), from when the action's messages had arrived to its end (waiting is not work);
for the pipeline: iteration time (the schedule's makespan, from the barrier that starts each
iteration to the last action's end on the slowest rank), bubble fraction
(``1 - busy / (S * makespan)`` with busy the actions' work, as the simulator defines it) and
per-rank peak memory (measured: see :mod:`autopipe.runtime.meters`; ``memory_kind`` says how) and
per-rank peak live tensor bytes (counted over one step, :func:`~autopipe.runtime.run.worker.tensor_step`),
both beside the plan's predicted peak. The first step is a warm-up and is left out when there are
more, and so is the step whose tensors were counted (counting slows it) when others remain. The torch engine records no
actions: its stage rows are blank and its iteration is the whole step. :func:`summary` is
``autopipe run --json``'s object; :func:`write_loss_plot` draws the losses (matplotlib). ``chrome_trace``
writes what happened as a Chrome / Perfetto
trace: one row per rank, one event per action and one per wait for its messages.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopipe._io import atomic_write_text
from autopipe.plans import Plan
from autopipe.runtime.run.breakdown import Breakdown, breakdown, explain
from autopipe.runtime.run.records import RunResult
from autopipe.schedules import Action

__all__ = [
    "Row",
    "chrome_trace",
    "compare",
    "format_breakdown",
    "format_report",
    "summary",
    "write_chrome_trace",
    "write_loss_plot",
]


@dataclass(frozen=True)
class Row:
    what: str  # "stage 0 F", "iteration", "bubble", "peak memory rank 1"
    predicted: float
    measured: float
    unit: str  # "s", "fraction" or "bytes"

    @property
    def error_pct(self) -> float:
        """(measured - predicted) / predicted, in percent (nan without a prediction)."""
        return (self.measured - self.predicted) / self.predicted * 100 if self.predicted else math.nan


def _measured_steps(result: RunResult) -> tuple[int, ...]:
    """The steps whose times count: not the warm-up, nor the step counted by the tensor counter,
    unless nothing else is left."""
    steps = range(1 if result.steps > 1 else 0, result.steps)
    counted = {r.tensor_step for r in result.ranks}
    return tuple(k for k in steps if k not in counted) or tuple(steps)


def _durations(result: RunResult, steps: Sequence[int]) -> dict[tuple[int, str], list[float]]:
    out: dict[tuple[int, str], list[float]] = {}
    for r in result.ranks:
        for k in steps:
            for rec in r.iterations[k].records:
                a = Action.parse(rec.action)
                if a is not None:
                    out.setdefault((a.stage, a.kind), []).append(rec.compute_s)
    return out


def measured_bubble(result: RunResult, step: int) -> float:
    span = max(r.iterations[step].makespan_s for r in result.ranks)
    busy = sum(rec.compute_s for r in result.ranks for rec in r.iterations[step].records)
    if not any(r.iterations[step].records for r in result.ranks):
        return math.nan  # no actions recorded (the torch engine)
    return 1.0 - busy / (len(result.ranks) * span) if span > 0 else 0.0


def compare(plan: Plan, result: RunResult) -> list[Row]:
    """The rows of the report (``Row.error_pct`` is the error in percent)."""
    steps = _measured_steps(result)
    times = _durations(result, steps)
    split = any(kind == "W" for _, kind in times)
    rows = []

    def mean(key: tuple[int, str]) -> float:
        return statistics.fmean(times[key]) if key in times else math.nan

    for s in plan.stages:
        rows.append(
            Row(
                f"stage {s.index} F",
                s.forward_s,
                mean((s.index, "F")),
                "s",
            )
        )
        b_pred = s.backward_input_s if split else s.backward_s
        rows.append(
            Row(
                f"stage {s.index} B",
                b_pred,
                mean((s.index, "B")),
                "s",
            )
        )
        if split:
            rows.append(
                Row(
                    f"stage {s.index} W",
                    s.backward_weight_s,
                    mean((s.index, "W")),
                    "s",
                )
            )
    spans = result.makespans()
    rows.append(Row("iteration", plan.iteration_time_s, statistics.fmean(spans[k] for k in steps), "s"))
    rows.append(
        Row(
            "bubble",
            plan.bubble_fraction,
            statistics.fmean(measured_bubble(result, k) for k in steps),
            "fraction",
        )
    )
    for r in result.ranks:
        pred = plan.peak_memory_bytes[r.rank] if r.rank < len(plan.peak_memory_bytes) else 0.0
        rows.append(Row(f"peak memory rank {r.rank}", pred, float(r.peak_memory_bytes), "bytes"))
        rows.append(Row(f"tensor bytes rank {r.rank}", pred, float(r.peak_tensor_bytes), "bytes"))
    return rows


def _fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "-"
    if unit == "s":
        return f"{value * 1e3:.3f} ms"
    if unit == "fraction":
        return f"{value:.1%}"
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {name}"
    return f"{value:.0f} B"


def format_report(plan: Plan, result: RunResult) -> str:
    """A plain-text table: predicted, measured and error per row, then the losses."""
    rows = compare(plan, result)
    width = max(len(r.what) for r in rows)
    lines = [f"{'':<{width}}  {'predicted':>12}  {'measured':>12}  {'error':>8}"]
    for r in rows:
        err = "" if math.isnan(r.error_pct) else f"{r.error_pct:+.1f}%"
        lines.append(f"{r.what:<{width}}  {_fmt(r.predicted, r.unit):>12}  {_fmt(r.measured, r.unit):>12}  {err:>8}")
    where = breakdown(plan, result, _measured_steps(result))
    if where is not None:
        lines.extend(format_breakdown(where))
    timed = _measured_steps(result)
    left = [f"step {k + 1}" for k in range(result.steps) if k not in timed]
    lines.append(
        f"(times: means over {len(timed)} step(s){', ' + ' and '.join(left) + ' left out' if left else ''}; "
        f"peak memory: {result.ranks[0].memory_kind}; tensor bytes: {tensor_kind(result)})"
    )
    if result.losses:
        lines.append("loss per step: " + ", ".join(f"{x:.6g}" for x in result.losses))
    return "\n".join(lines)


def format_breakdown(where: Breakdown) -> list[str]:
    """The slowest rank's iteration, predicted and measured, split into compute, messages, idle."""
    p, m, d = where.predicted, where.measured, where.difference()
    head = "where the iteration went (slowest rank)"
    lines = [f"{head:<40}  {'predicted':>12}  {'measured':>12}  {'difference':>12}  {'error':>8}"]
    for name, a, b, c in (
        ("compute (actions, executor between them)", p.compute_s, m.compute_s, d.compute_s),
        ("messages (sent, not yet arrived)", p.messages_s, m.messages_s, d.messages_s),
        ("idle (the peer still working)", p.idle_s, m.idle_s, d.idle_s),
        ("iteration", p.total_s, m.total_s, d.total_s),
    ):
        share = f"{c / p.total_s:+.1%}" if p.total_s else ""  # of the predicted iteration: the parts sum to its error
        lines.append(f"{name:<40}  {_fmt(a, 's'):>12}  {_fmt(b, 's'):>12}  {c * 1e3:>+9.3f} ms  {share:>8}")
    why = explain(where)
    return [*lines, why] if why else lines


def summary(plan: Plan, result: RunResult) -> dict[str, Any]:
    """The run as one JSON-ready object (``autopipe run --json``)."""
    steps = _measured_steps(result)
    spans = result.makespans()
    first = result.ranks[0]
    rows = [
        {
            "what": r.what,
            "predicted": r.predicted,
            "measured": _number(r.measured),
            "unit": r.unit,
            "error_pct": _number(r.error_pct),
        }
        for r in compare(plan, result)
    ]
    return {
        "engine": first.engine,
        "data": first.data,
        "steps": result.steps,
        "losses": list(result.losses),
        "iteration_time_s": statistics.median(spans[k] for k in steps) if result.steps else None,
        "predicted_iteration_time_s": plan.iteration_time_s,
        "peak_memory_bytes": [r.peak_memory_bytes for r in result.ranks],
        "predicted_peak_memory_bytes": list(plan.peak_memory_bytes),
        "memory_kind": first.memory_kind,
        "peak_tensor_bytes": [r.peak_tensor_bytes for r in result.ranks],
        "tensor_step": first.tensor_step,
        "rows": rows,
        "breakdown": _breakdown_dict(breakdown(plan, result, steps)),
    }


def tensor_kind(result: RunResult) -> str:
    """How ``peak_tensor_bytes`` were found, in words (which step, which meter)."""
    step = result.ranks[0].tensor_step + 1 if result.ranks else 1
    cuda = bool(result.ranks) and result.ranks[0].memory_kind.startswith("cuda")
    how = "torch.cuda.max_memory_allocated" if cuda else "live tensor storages"
    return f"{how} at their peak over step {step} (weights, gradients, optimizer state, activations, messages)"


def _breakdown_dict(where: Breakdown | None) -> dict[str, dict[str, float]] | None:
    if where is None:
        return None
    parts = {"predicted": where.predicted, "measured": where.measured, "difference": where.difference()}
    return {
        k: {"compute_s": s.compute_s, "messages_s": s.messages_s, "idle_s": s.idle_s, "total_s": s.total_s}
        for k, s in parts.items()
    }


def _number(x: float) -> float | None:
    return None if math.isnan(x) else x  # JSON has no NaN


def write_loss_plot(losses: list[float], path: str | Path, title: str) -> None:
    """The loss per step as a PNG (written to a temporary name, then renamed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (batch mean)")
    ax.set_title(title)
    fig.tight_layout()
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, target)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def chrome_trace(result: RunResult) -> dict[str, Any]:
    """Chrome trace events (chrome://tracing, ui.perfetto.dev): pid 0, one tid per rank."""
    origin = min((it.start_time for r in result.ranks for it in r.iterations), default=0.0)
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "autopipe pipeline"}},
    ]
    for r in result.ranks:
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": r.rank,
                "args": {"name": f"rank {r.rank}"},
            }
        )
        for k, it in enumerate(r.iterations):
            base = it.start_time - origin
            for rec in it.records:
                a = Action.parse(rec.action)
                args = {"step": k, "stage": a.stage if a else -1, "microbatch": a.microbatch if a else -1}
                if rec.wait_s > 0:
                    events.append(
                        {
                            "name": f"wait {rec.action}",
                            "cat": "wait",
                            "ph": "X",
                            "pid": 0,
                            "tid": r.rank,
                            "ts": (base + rec.start_s) * 1e6,
                            "dur": rec.wait_s * 1e6,
                            "args": args,
                        }
                    )
                events.append(
                    {
                        "name": rec.action,
                        "cat": a.kind if a else "",
                        "ph": "X",
                        "pid": 0,
                        "tid": r.rank,
                        "ts": (base + rec.ready_s) * 1e6,
                        "dur": rec.compute_s * 1e6,
                        "args": args,
                    }
                )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(result: RunResult, path: str | Path) -> None:
    atomic_write_text(path, json.dumps(chrome_trace(result)))
