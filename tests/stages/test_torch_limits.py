"""autopipe.schedules.torch_limits: what torch's schedule classes refuse, said before any rank starts
(issue 27); the rules checked against the classes themselves."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from autopipe.cli.main import main

from autopipe.errors import PlanError
from autopipe.schedules.torch_limits import torch_refusal
from autopipe.stages.export import to_torch_pipelining
from autopipe.stages.rebuild import rebuild_model
from tests.helpers import even_plan


def test_one_line_refusals_name_the_class_and_what_to_plan() -> None:
    assert torch_refusal("1f1b", 2, 1, 2) == (
        "torch's Schedule1F1B (1f1b) needs at least as many micro-batches as stages (2), and the plan has 1; "
        "plan with --micro-batches 2 or more, or run with --engine autopipe"
    )
    assert torch_refusal("zb-h1", 2, 5, 2) == (
        "torch's ScheduleInterleavedZeroBubble (zb-h1) needs micro-batches in whole rounds (a multiple of 2 for 5 "
        "on 2 ranks); plan with --micro-batches 4 or 6, or run with --engine autopipe"
    )
    assert "needs at least as many micro-batches as stages (4)" in str(torch_refusal("dualpipe-v", 2, 3, 4))
    assert "exactly 2 stages per rank" in str(torch_refusal("zb-v", 2, 4, 2))
    runs = [("1f1b", 2, 2, 2), ("zb-h1", 2, 1, 2), ("zb-h1", 2, 3, 2), ("zb-v", 2, 1, 4), ("gpipe", 2, 1, 2)]
    runs += [("zb-h2", 2, 1, 2), ("v-half", 2, 4, 4), ("interleaved-1f1b", 2, 4, 4), ("dualpipe-v", 2, 4, 4)]
    for case in runs:
        assert torch_refusal(*case) is None, case


class _Stage:
    """What torch's schedule constructors read of a stage (no process group needed)."""

    def __init__(self, index: int, stages: int, ranks: int) -> None:
        self.stage_index, self.num_stages, self.group_size = index, stages, ranks
        self.group_rank, self.is_first, self.is_last = 0, index == 0, index == stages - 1
        self.submod = torch.nn.Identity()
        self.has_backward = True
        self.stage_index_to_group_rank: dict[int, int] = {}


@pytest.mark.parametrize(
    ("schedule", "cls", "virtual"),
    [
        ("1f1b", "Schedule1F1B", 1),
        ("zb-h1", "ScheduleInterleavedZeroBubble", 1),
        ("interleaved-1f1b", "ScheduleInterleaved1F1B", 2),
        ("dualpipe-v", "ScheduleDualPipeV", 2),
    ],
)
def test_the_rules_are_the_classes_own(schedule: str, cls: str, virtual: int) -> None:
    from torch.distributed import pipelining

    ranks = 2
    stages = ranks * virtual
    for m in range(1, 9):
        made: list[Any] = [_Stage(j, stages, ranks) for j in (0, stages - 1)] if virtual == 2 else [_Stage(0, 2, 2)]
        try:
            kind = getattr(pipelining, cls)
            kind(made if virtual == 2 or cls != "Schedule1F1B" else made[0], n_microbatches=m, loss_fn=None)
            refused = False
        except ValueError:
            refused = True
        except Exception:  # a later step of the constructor needs a real stage: m passed
            refused = False
        assert (torch_refusal(schedule, ranks, m, stages) is not None) == refused, (schedule, m)


def test_to_torch_pipelining_refuses_before_tracing() -> None:
    plan = even_plan("mlp.py", stages=2, schedule="1f1b", micro_batches=1)
    loaded = rebuild_model(plan)
    with pytest.raises(PlanError, match=r"^torch's Schedule1F1B \(1f1b\) needs at least as many micro-batches"):
        to_torch_pipelining(plan, loaded.model, 0, example_inputs=loaded.make_inputs(2), loss_fn=loaded.loss_fn)


def test_run_engine_torch_refuses_in_one_line_before_any_rank_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    even_plan("mlp.py", stages=2, schedule="1f1b", micro_batches=1).save(tmp_path / "plan.json")

    def no_rank(*args: object, **kwargs: object) -> None:
        raise AssertionError("a rank was started")

    monkeypatch.setattr(subprocess, "Popen", no_rank)
    assert main(["run", str(tmp_path / "plan.json"), "--engine", "torch", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "autopipe: error: --engine torch: torch's Schedule1F1B (1f1b) needs at least as many micro-batches as "
        "stages (2), and the plan has 1; plan with --micro-batches 2 or more, or run with --engine autopipe\n"
    )


@pytest.mark.parametrize("seed", range(8))
def test_a_plan_for_target_torch_is_one_torch_runs(seed: int) -> None:
    import dataclasses
    import random

    from autopipe.planner import plan_pipeline
    from tests.planner.test_search import _request, random_profile

    rng = random.Random(seed)
    n = rng.randint(4, 12)
    # memory to spare: torch's stages recompute nothing (Target.never_recomputes), so neither plan needs to
    req = _request(devices=rng.randint(2, min(4, n)), batch_size=rng.choice([2, 4, 5, 8, 10, 12]), memory_limit=2**40)
    prof = random_profile(n, seed)
    plan = plan_pipeline(prof, dataclasses.replace(req, target="torch"))
    assert torch_refusal(plan.schedule, plan.devices, plan.micro_batches, len(plan.stages)) is None
    free = plan_pipeline(prof, req)
    if torch_refusal(free.schedule, free.devices, free.micro_batches, len(free.stages)) is None:
        assert plan.iteration_time_s == free.iteration_time_s  # nothing to steer away from


def test_target_torch_with_a_micro_batch_count_torch_refuses_is_one_line() -> None:
    import dataclasses

    from autopipe.planner import plan_pipeline
    from tests.planner.test_search import _request, random_profile

    # the free plan of this profile is ZB-H1 with 5 micro-batches on 2 ranks, which torch's class refuses
    free = plan_pipeline(random_profile(6, 0), _request(devices=2, batch_size=5, memory_limit=2**40))
    assert (free.schedule, free.micro_batches) == ("zb-h1", 5)
    steered = plan_pipeline(random_profile(6, 0), _request(devices=2, batch_size=5, memory_limit=2**40, target="torch"))
    assert torch_refusal(steered.schedule, 2, steered.micro_batches, len(steered.stages)) is None
    assert steered.iteration_time_s >= free.iteration_time_s * (1 - 1e-9)
    req = _request(devices=2, batch_size=8, schedule="1f1b", micro_batches=1, memory_limit=2**40, target="torch")
    with pytest.raises(PlanError) as info:
        plan_pipeline(random_profile(6, 0), req)
    assert str(info.value) == (
        "target=torch: torch's Schedule1F1B (1f1b) needs at least as many micro-batches as stages (2), and the "
        "plan has 1; plan with micro_batches=2 or more, or plan for target=autopipe (autopipe's engine runs every "
        "micro-batch count)"
    )
    assert plan_pipeline(random_profile(6, 0), dataclasses.replace(req, micro_batches=2)).micro_batches == 2


def test_target_torchtitan_refusal_names_the_cli_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """From the CLI the refusal names flags, and the way out is another target, not another engine."""
    from tests.helpers import ROOT

    args = ["plan", str(ROOT / "models" / "mlp.py"), "--devices", "2", "--schedule", "1f1b", "--micro-batches", "1"]
    assert main([*args, "--target", "torchtitan"]) == 2
    assert capsys.readouterr().err == (
        "autopipe: error: --target torchtitan: torch's Schedule1F1B (1f1b) needs at least as many micro-batches as "
        "stages (2), and the plan has 1; plan with --micro-batches 2 or more, or plan for --target autopipe "
        "(autopipe's engine runs every micro-batch count)\n"
    )
