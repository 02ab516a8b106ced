"""The run report against the plan's predictions, and the Chrome trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autopipe.runtime import RunOptions, run_threads
from autopipe.runtime.run.breakdown import breakdown
from autopipe.runtime.run.records import RunResult
from autopipe.runtime.run.report import chrome_trace, compare, format_report
from tests.runtime.helpers import cached_plan

torch.set_num_threads(1)


def test_report_and_chrome_trace(tmp_path: Path) -> None:
    plan = cached_plan("skip", 2, "zb-h1")
    result = RunResult(tuple(run_threads(plan, RunOptions(steps=2))))
    rows = {r.what: r for r in compare(plan, result)}
    assert {
        "stage 0 F",
        "stage 1 B",
        "stage 1 W",
        "iteration",
        "bubble",
        "peak memory rank 1",
    } <= set(rows)
    assert all(r.measured > 0 for r in rows.values() if r.what != "bubble")
    assert rows["iteration"].error_pct == pytest.approx((rows["iteration"].measured / plan.iteration_time_s - 1) * 100)
    assert "predicted" in format_report(plan, result)
    where = breakdown(plan, result, range(1, 2))
    assert where is not None and where.measured.total_s == pytest.approx(rows["iteration"].measured)
    assert where.predicted.messages_s == 0  # this plan's links are free (send_bytes 0)
    every = [e for e in chrome_trace(result)["traceEvents"] if e["ph"] == "X"]
    events = [e for e in every if e["cat"] != "wait"]
    assert len(events) == 2 * 3 * 4 * 2  # steps x (F, B, W) x micro-batches x stages
    assert {e["tid"] for e in events} == {0, 1}
    starts = {(e["tid"], e["name"], e["args"]["step"]): e["ts"] for e in events}
    for w in (e for e in every if e["cat"] == "wait"):  # a wait ends where its action starts
        key = (w["tid"], w["name"].removeprefix("wait "), w["args"]["step"])
        assert w["ts"] + w["dur"] == pytest.approx(starts[key])
    assert RunResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
