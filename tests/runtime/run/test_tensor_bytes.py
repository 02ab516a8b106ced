"""``autopipe run`` counts live tensor bytes on real gloo processes, and they agree with the plan.

A measured profile of a small MLP, planned on two ranks with 1F1B, run for two steps: every
rank reports ``peak_tensor_bytes`` (the second step counted), within ``TOLERANCE`` of the plan's
predicted peak for that rank. The counter itself: tests/runtime/test_meters.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import autopipe
from autopipe.runtime import RunOptions
from autopipe.runtime.run.launch import launch
from autopipe.runtime.run.report import format_report, summary

MLP = Path(__file__).parents[3] / "models" / "mlp.py"
GPT = Path(__file__).parents[3] / "models" / "gpt.py"
# |measured - predicted| / predicted, per rank: within 0.5% on this MLP and 8.3% on the bundled
# GPT, every schedule (docs/benchmarks.md, bench_tensor_bytes.py).
TOLERANCE = 0.10

torch.set_num_threads(1)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("recompute", [autopipe.Recompute.NEVER, autopipe.Recompute.ALWAYS])
def test_peak_tensor_bytes_per_rank_match_the_plan(recompute: autopipe.Recompute) -> None:
    profile = autopipe.profile(str(MLP), micro_batch_sizes=(2,), warmup=1, repeat=1)
    choices = autopipe.Choices(schedule="1f1b", micro_batches=4, recompute=recompute)
    plan = autopipe.plan_profile(profile, stages=2, batch_size=8, memory="1GiB", choices=choices)
    result = launch(plan, RunOptions(steps=2, device="cpu", timeout_s=60))
    measured = summary(plan, result)["peak_tensor_bytes"]
    assert len(measured) == plan.devices and all(isinstance(b, int) and b > 0 for b in measured)
    for rank, (got, predicted) in enumerate(zip(measured, plan.peak_memory_bytes, strict=True)):
        assert abs(got - predicted) <= TOLERANCE * predicted, (rank, got, predicted)
    assert "tensor bytes rank 1" in format_report(plan, result)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_zb_h2_holds_what_b_keeps_for_w_as_planned() -> None:
    """ZB-H2 defers W the most: the bytes each B keeps for its W (the gradients W restarts from,
    none on the first stage, whose B computes nothing) pile up on both ranks as planned."""
    profile = autopipe.profile(str(GPT), micro_batch_sizes=(2,), warmup=1, repeat=1)
    choices = autopipe.Choices(schedule="zb-h2", micro_batches=4, recompute=autopipe.Recompute.NEVER)
    plan = autopipe.plan_profile(profile, stages=2, batch_size=8, memory="1GiB", choices=choices)
    assert plan.stages[0].kept_bytes == 0 < plan.stages[1].kept_bytes
    result = launch(plan, RunOptions(steps=2, device="cpu", timeout_s=60))
    measured = summary(plan, result)["peak_tensor_bytes"]
    for rank, (got, predicted) in enumerate(zip(measured, plan.peak_memory_bytes, strict=True)):
        assert abs(got - predicted) <= TOLERANCE * predicted, (rank, got, predicted)
