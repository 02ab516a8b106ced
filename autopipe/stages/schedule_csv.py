"""A plan's schedule as data for stock PyTorch: the CSV ``_PipelineScheduleRuntime`` loads.

torch.distributed.pipelining's ``_PipelineScheduleRuntime._load_csv(path)`` (torch 2.13,
``format="compute_only"``) reads one row per rank, each cell one ``_Action`` as
``_Action.from_str`` parses it: ``<stage><type><micro-batch>`` with the stage the global
virtual-stage (chunk) index, and the ranks' communication added by torch's own lowering
(``_add_send_recv``); the stage -> rank mapping is read off the rows, so a V placement needs
nothing else. torchtitan takes the same file as ``parallelism.pipeline_parallel_schedule_csv``.
autopipe's kinds become torch's letters:

- ``F`` forward -> ``F``;
- ``B`` -> ``I`` (backward-input) when the schedule has a ``W`` for that (stage, micro-batch),
  else ``B`` (torch's full backward);
- ``W`` -> ``W`` (backward-weight);
- an overlapped F&B pair (DualPipeV's, ``ScheduleSpec.overlapped``) -> one cell
  ``(0F3;3I1)OVERLAP_F_B``, which torch 2.13 parses and runs as its two actions in order.

A V-Half plan on 2 ranks with 4 micro-batches (chunks 0, 3 on rank 0; 1, 2 on rank 1)::

    0F0,0F1,0F2,3F0,3I0,3W0,3F1,0I0,3I1,3W1,3F2,0W0,0F3,0I1,3I2,3W2,3F3,3I3,0I2,3W3,0I3,0W1,0W2,0W3
    1F0,2F0,1F1,2F1,2I0,2W0,1I0,1W0,1F2,2F2,2I1,1I1,2W1,1F3,1W1,2F3,2I2,1I2,2I3,1I3,2W2,2W3,1W2,1W3

The rows are the plan's exact per-rank order (:func:`plan_actions`, what autopipe's executor
runs). Recomputation is no action in torch's format (it is a stage's activation checkpointing,
not a step of the schedule), so :func:`schedule_csv` refuses a plan that recomputes.

Tests: tests/stages/test_schedule_csv.py.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from autopipe._io import atomic_write_text, check_output_file
from autopipe.errors import PlanError
from autopipe.plans import Plan
from autopipe.schedules import Action, Kind, Schedule, schedule_spec

__all__ = ["plan_actions", "schedule_csv", "torch_rows", "write_schedule_csv"]


def plan_actions(plan: Plan) -> Schedule:
    """The plan's action lists, in the order each rank runs them; PlanError if the plan puts a
    stage on another device than its schedule does (a plan edited by hand)."""
    spec = schedule_spec(plan.schedule)
    placed = spec.devices_of(plan.devices, plan.virtual)
    for st in plan.stages:
        if st.index < len(placed) and st.rank != placed[st.index]:
            raise PlanError(
                f"stage {st.index} of the plan is on device {st.rank}, but the {spec.name} schedule "
                f"runs it on device {placed[st.index]}; plan again or set its rank to {placed[st.index]}"
            )
    return spec.make(plan.devices, plan.micro_batches, plan.virtual)


def torch_rows(plan: Plan) -> list[list[str]]:
    """One row per rank (rank 0 first) of torch ``_Action`` strings: the plan's exact order."""
    schedule = plan_actions(plan)
    spec = schedule_spec(plan.schedule)
    weights = {
        (a.stage, a.microbatch) for acts in schedule.values() for a in acts if a is not None and a.kind is Kind.WEIGHT
    }

    def cell(a: Action) -> str:
        if a.kind is Kind.BACKWARD:
            return f"{a.stage}{'I' if (a.stage, a.microbatch) in weights else 'B'}{a.microbatch}"
        return str(a)  # F and W print as torch spells them

    rows = []
    for rank in range(plan.devices):
        actions = [a for a in schedule.get(rank, []) if a is not None]
        pairs = {} if spec.overlapped is None else dict(spec.overlapped(rank, plan.devices, plan.micro_batches))
        row: list[str] = []
        i = 0
        while i < len(actions):
            a = actions[i]
            b = pairs.get(a)
            if b is not None and i + 1 < len(actions) and actions[i + 1] == b:
                row.append(f"({cell(a)};{cell(b)})OVERLAP_F_B")
                i += 2
                continue
            row.append(cell(a))
            i += 1
        rows.append(row)
    return rows


def schedule_csv(plan: Plan) -> str:
    """The plan's schedule as the CSV text ``_PipelineScheduleRuntime._load_csv`` reads;
    PlanError (one line) for a plan that recomputes, which the format cannot say."""
    recomputed = [st.index for st in plan.stages if st.recompute]
    if recomputed:
        raise PlanError(
            f"stage(s) {', '.join(map(str, recomputed))} of the plan recompute, and torch's schedule CSV has no "
            "recomputation action; plan with --no-recompute, or run it with autopipe's executor"
        )
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows(torch_rows(plan))
    return out.getvalue()


def write_schedule_csv(plan: Plan, path: str | Path, what: str = "--schedule-csv") -> Path:
    """Write :func:`schedule_csv` to ``path`` atomically; ``what`` names the path in errors."""
    target = check_output_file(path, what, example=f"{plan.schedule}.csv")
    atomic_write_text(target, schedule_csv(plan))
    return target
