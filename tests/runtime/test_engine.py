"""The pipeline engine: training with the pipeline equals training the unsplit model (torchgpipe's
transparency test), on thread ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autopipe.runtime import RunOptions, assemble_state_dict, run_threads
from autopipe.runtime.run.records import RunResult
from tests.helpers import max_diff, reference_training
from tests.runtime.helpers import (
    GPT,
    SKIP,
    STEPS,
    TOL,
    cached_plan,
    run_and_assemble,
    skip_without_transformers,
    unsplit_reference,
)

torch.set_num_threads(1)


CASES = [
    # model, ranks, schedule, virtual, recomputed stages
    ("skip", 2, "gpipe", 1, ()),
    ("skip", 2, "1f1b", 1, ()),
    ("skip", 2, "interleaved-1f1b", 2, ()),
    ("skip", 2, "zb-h1", 1, ()),
    ("skip", 4, "gpipe", 1, ()),
    ("skip", 4, "1f1b", 1, (1, 2)),
    ("skip", 4, "interleaved-1f1b", 2, ()),
    ("skip", 4, "zb-h1", 1, (0, 3)),
    ("skip", 2, "zb-v", 2, ()),
    ("skip", 4, "zb-v", 2, (0, 5)),
    ("skip", 2, "dualpipe-v", 2, ()),
    ("skip", 4, "dualpipe-v", 2, (1, 6)),  # m = 8: DualPipeV runs at least 2 per rank
    ("skip", 2, "v-half", 2, ()),
    ("skip", 4, "v-half", 2, (1, 6)),
    ("skip", 2, "v-min", 2, (0, 3)),
    ("skip", 4, "v-min", 2, ()),
    ("skip", 2, "zb-h2", 1, (1,)),
    ("skip", 4, "zb-h2", 1, ()),
    ("gpt", 2, "gpipe", 1, ()),
    ("gpt", 2, "1f1b", 1, ()),
    ("gpt", 2, "interleaved-1f1b", 2, ()),
    ("gpt", 2, "zb-h1", 1, ()),
    ("gpt", 2, "1f1b", 1, (0, 1)),
    ("gpt", 2, "zb-h1", 1, (1,)),
    ("gpt", 2, "zb-v", 2, (1, 2)),
    ("gpt", 2, "dualpipe-v", 2, (0, 3)),
    ("gpt", 2, "v-half", 2, ()),
    ("gpt", 2, "v-min", 2, (1, 2)),
    ("gpt", 4, "1f1b", 1, ()),
    ("hf", 2, "gpipe", 1, ()),
    ("hf", 2, "1f1b", 1, (1,)),
    ("hf", 2, "interleaved-1f1b", 2, ()),
    ("hf", 2, "zb-h1", 1, ()),
]
SLOW = {("skip", 4, "v-half"), ("skip", 4, "v-min"), ("gpt", 2, "v-half"), ("gpt", 2, "v-min"), ("skip", 4, "zb-h2")}
HF_SLOW = [
    pytest.param(*case, marks=pytest.mark.slow) if case[0].startswith("hf") or case[:3] in SLOW else case
    for case in CASES
]


@pytest.mark.parametrize(("model", "ranks", "schedule", "virtual", "recompute"), HF_SLOW)
def test_pipeline_training_equals_unsplit_training(
    model: str, ranks: int, schedule: str, virtual: int, recompute: tuple[int, ...], tmp_path: Path
) -> None:
    skip_without_transformers(model)
    plan = cached_plan(model, ranks, schedule, virtual, recompute)
    ref_losses, ref_state = unsplit_reference(model)
    result, state = run_and_assemble(plan, tmp_path)
    assert len(result.losses) == STEPS
    assert max(abs(a - b) for a, b in zip(result.losses, ref_losses, strict=True)) <= TOL
    assert set(state) == set(ref_state)  # the whole state_dict, original names (tied ones too)
    assert max_diff(state, ref_state) <= TOL
    assert max_diff(state, unsplit_reference(model, 0)[1]) > 1e-3  # training moved the weights


def test_adam_matches_unsplit_training(tmp_path: Path) -> None:
    plan = cached_plan("skip", 2, "1f1b")
    file, kwargs = SKIP
    ref_losses, ref_state = reference_training(file, kwargs, steps=STEPS, batch_size=8, lr=1e-2, optimizer="Adam")
    opts = RunOptions(steps=STEPS, optimizer="Adam", lr=1e-2, save_checkpoint=str(tmp_path))
    result = RunResult(tuple(run_threads(plan, opts)))
    assert max(abs(a - b) for a, b in zip(result.losses, ref_losses, strict=True)) <= TOL
    assert max_diff(assemble_state_dict(tmp_path), ref_state) <= 1e-4


def test_planned_state_bytes_are_what_each_rank_holds() -> None:
    """Weights, gradients and SGD's momentum per stage as planned (state_factor 3), the tied
    embedding's copy on the LM head's stage included, are exactly what the ranks hold."""
    from autopipe.costs.analytic import analytic_profile
    from autopipe.costs.devices import device_spec
    from autopipe.model.load import load_model
    from autopipe.planner.search import PlanRequest, plan_pipeline

    file, kwargs = GPT
    profile = analytic_profile(load_model(file, kwargs, device="meta"), device_spec("h100"), micro_batch_sizes=(2,))
    assert profile.blocks[-1].shared_param_bytes > 0  # lm_head uses wte.weight
    request = PlanRequest(
        devices=2, batch_size=8, memory_limit=2.0**30, micro_batches=4, schedule="1f1b", state_factor=3.0
    )
    plan = plan_pipeline(profile, request)
    options = RunOptions(steps=1, optimizer="SGD", lr=1e-3, optimizer_kwargs=(("momentum", 0.9),))
    for r in run_threads(plan, options):
        assert r.static_bytes == sum(s.static_bytes for s in plan.stages if s.rank == r.rank)


@pytest.mark.parametrize(("schedule", "virtual"), [("1f1b", 1), ("interleaved-1f1b", 2)])
def test_the_engine_records_what_each_action_spent_sending(schedule: str, virtual: int) -> None:
    """Issue 28: an action that sends to another rank records its sending (part of its work),
    one that does not records none: the actions simulate/sends.py charges, and only those."""
    from autopipe.schedules import Action
    from autopipe.simulate import sends_of

    plan = cached_plan("gpt4", 2, schedule, virtual)
    forward, backward = sends_of([s.rank for s in plan.stages])
    for r in run_threads(plan, RunOptions(steps=1)):
        for rec in r.iterations[0].records:
            a = Action.parse(rec.action)
            assert a is not None
            sends = forward[a.stage] if a.kind == "F" else backward[a.stage] if a.kind == "B" else False
            assert (rec.send_s > 0) == sends, rec
            assert 0.0 <= rec.send_s <= rec.compute_s
