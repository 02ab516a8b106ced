"""autopipe.stages.schedule_csv: a plan's exact order as the CSV torch's ``_PipelineScheduleRuntime``
loads, read back by torch's own parser, validated and lowered by torch, run in 2 gloo ranks
(csv_worker.py), and written by ``autopipe emit --schedule-csv``."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from autopipe.cli.main import main
from torch.distributed.pipelining import schedules as torch_schedules

from autopipe.errors import PlanError
from autopipe.schedules import SPECS, schedule_spec
from autopipe.stages.rebuild import rebuild_model
from autopipe.stages.schedule_csv import plan_actions, schedule_csv, torch_rows
from tests.helpers import even_plan, reference_training
from tests.stages import csv_worker, tied_worker
from tests.stages.test_export import _run_ranks

torch.set_num_threads(1)


def _plan(schedule: str, devices: int, m: int, recompute: tuple[int, ...] = ()) -> Any:
    """What the CSV reads of a plan (schedule, sizes, where each stage runs), without a model."""
    spec = schedule_spec(schedule)
    v = 2 if spec.takes_virtual else 1
    placed = spec.devices_of(devices, v)
    stages = [SimpleNamespace(index=j, rank=placed[j], recompute=j in recompute) for j in range(devices * v)]
    return SimpleNamespace(schedule=schedule, devices=devices, virtual=v, micro_batches=m, stages=stages)


def _parsed(text: str) -> dict[int, list[Any]]:
    """The CSV as torch reads it (``_load_csv``'s loop: one row per rank, ``_Action.from_str``)."""
    return {
        r: [torch_schedules._Action.from_str(s) for s in row] for r, row in enumerate(csv.reader(io.StringIO(text)))
    }


CASES = [(spec.name, devices, m) for spec in SPECS for devices, m in ((2, 4), (3, 6), (4, 16))]


@pytest.mark.parametrize(("schedule", "devices", "m"), CASES)
def test_the_csv_is_the_plans_order_as_torch_parses_validates_and_lowers_it(
    schedule: str, devices: int, m: int
) -> None:
    plan = _plan(schedule, devices, m)
    want = {r: [a for a in acts if a is not None] for r, acts in plan_actions(plan).items()}
    weights = {(a.stage, a.microbatch) for acts in want.values() for a in acts if a.kind == "W"}
    parsed = _parsed(schedule_csv(plan))
    assert sorted(parsed) == list(range(devices))
    back = {"F": "F", "I": "B", "B": "B", "W": "W"}  # torch's letters -> autopipe's kinds
    for r, actions in parsed.items():
        flat = [sub for a in actions for sub in (a.sub_actions or (a,))]
        got = [(s.stage_index, back[s.computation_type.value], s.microbatch_index) for s in flat]
        assert got == [(a.stage, a.kind.value, a.microbatch) for a in want[r]], (schedule, r)
        for s in flat:  # I exactly where the plan runs a W for that (stage, micro-batch) apart
            if s.computation_type.value in "IB":
                assert (s.computation_type.value == "I") == ((s.stage_index, s.microbatch_index) in weights)
        pairs = [a for a in actions if a.sub_actions is not None]
        spec = schedule_spec(schedule)
        assert len(pairs) == (len(spec.overlapped(r, devices, m)) if spec.overlapped else 0), (schedule, r)
        assert all(a.computation_type.value == "OVERLAP_F_B" for a in pairs)
    # torch's own checks: every stage's F / B / I / W counted, the placement read off the rows ...
    mapping = torch_schedules._validate_schedule(parsed, devices, devices * plan.virtual, m)
    assert [mapping[j] for j in range(devices * plan.virtual)] == [st.rank for st in plan.stages]
    # ... and its lowering to sends and receives finds no step it cannot schedule
    lowered = torch_schedules._add_send_recv(
        {r: list(acts) for r, acts in parsed.items()}, stage_to_rank=mapping.__getitem__, num_stages=len(mapping)
    )
    assert all(lowered[r] for r in range(devices))


def test_a_v_half_plans_csv() -> None:
    assert schedule_csv(_plan("v-half", 2, 4)) == (
        "0F0,0F1,0F2,3F0,3I0,3W0,3F1,0I0,3I1,3W1,3F2,0W0,0F3,0I1,3I2,3W2,3F3,3I3,0I2,3W3,0I3,0W1,0W2,0W3\n"
        "1F0,2F0,1F1,2F1,2I0,2W0,1I0,1W0,1F2,2F2,2I1,1I1,2W1,1F3,1W1,2F3,2I2,1I2,2I3,1I3,2W2,2W3,1W2,1W3\n"
    )
    assert torch_rows(_plan("1f1b", 2, 2)) == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def test_recomputation_is_refused_in_one_line_and_a_misplaced_stage_too() -> None:
    with pytest.raises(PlanError) as info:
        schedule_csv(_plan("v-half", 2, 4, recompute=(0, 3)))
    assert str(info.value) == (
        "stage(s) 0, 3 of the plan recompute, and torch's schedule CSV has no recomputation action; "
        "plan with --no-recompute, or run it with autopipe's executor"
    )
    plan = _plan("zb-v", 2, 4)
    plan.stages[3].rank = 1
    with pytest.raises(
        PlanError, match="stage 3 of the plan is on device 1, but the zb-v schedule runs it on device 0"
    ):
        torch_rows(plan)


def test_emit_writes_the_schedule_csv_and_bad_paths_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = even_plan("mlp.py", stages=2, virtual=2, schedule="v-half", micro_batches=4, reuse_trace=True)
    plan.save(str(tmp_path / "plan.json"))
    out = tmp_path / "schedule.csv"
    assert main(["emit", str(tmp_path / "plan.json"), "--schedule-csv", str(out)]) == 0
    assert out.read_text() == schedule_csv(plan)
    assert f"wrote {out}" in capsys.readouterr().out
    assert main(["emit", str(tmp_path / "plan.json"), "--schedule-csv", str(tmp_path)]) == 2  # a folder
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--schedule-csv" in err
    assert main(["emit", str(tmp_path / "plan.json")]) == 2  # neither -o nor --schedule-csv
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_v_half_v_min_and_zb_h2_csvs_train_in_two_gloo_ranks_as_one_process(tmp_path: Path) -> None:
    """torch has no class for V-Half, V-Min or ZB-H2: to_torch_pipelining (and Pipeline(engine="torch"),
    through it) builds _PipelineScheduleRuntime from the plan's CSV; 3 SGD steps (tied3.py under the
    V-shapes, its tied weight on both ranks; gpt.py under ZB-H2) give the unsplit model's losses and
    weights within 1e-6 relative."""
    got = _run_ranks("csv_worker.py", 2, tmp_path, timeout=200)
    for schedule, model in csv_worker.SCHEDULES.items():
        want_losses, want = reference_training(
            model, {}, steps=tied_worker.STEPS, batch_size=tied_worker.BATCH, lr=tied_worker.LR
        )
        plan = csv_worker.plan_for(schedule)
        rows = torch_rows(plan)
        start = {n: p.detach() for n, p in rebuild_model(plan).model.named_parameters()}
        assert max(float((want[n] - p).abs().max()) for n, p in start.items()) > 1e-3  # training moved the weights
        for r in range(2):
            built = got[r][f"{schedule}/built"]
            assert built["class"] == "_PipelineScheduleRuntime", schedule  # type: ignore[index]
            assert built["order"] == dict(enumerate(rows)), schedule  # type: ignore[index]
            assert built["stages"] == [st.index for st in plan.stages if st.rank == r]  # type: ignore[index]
        for way in csv_worker.WAYS:
            key = f"{schedule}/{way}"
            assert "error" not in got[0][key], (key, got[0][key])
            losses = got[0][key]["losses"] or got[1][key]["losses"]  # type: ignore[index]  # export: the last rank's
            assert len(losses) == tied_worker.STEPS, (key, losses)
            for a, b in zip(losses, want_losses, strict=True):
                assert abs(a - b) <= 1e-6 * abs(b), (key, losses, want_losses)
            held = set(got[0][key]["params"]) | set(got[1][key]["params"])  # type: ignore[index]
            assert held == set(start) - {"pooler.weight", "pooler.bias"}, key  # tied3's pooler: no forward uses it
            for r in range(2):
                for name, value in got[r][key]["params"].items():  # type: ignore[index]
                    scale = float(want[name].abs().max())
                    assert float((value - want[name]).abs().max()) <= 1e-6 * scale, (key, r, name)
