"""One rank of the schedule-CSV test (tests/stages/test_schedule_csv.py).

    python tests/stages/csv_worker.py RANK WORLD PORT OUT.pt [MODEL SCHEDULE ...]

tests/fixtures/tied3.py (one Parameter for the encoder embedding, decoder embedding and LM head),
or the model SCHEDULES names, trains tied_worker's STEPS SGD steps under each schedule of SCHEDULES
-- ones torch has no class for, so ``to_torch_pipelining`` builds ``_PipelineScheduleRuntime`` from
the plan's schedule CSV -- two ways: ``to_torch_pipelining`` in docs/outlets.md's loop, and
``autopipe.pipeline`` with the torch engine. Saved per (schedule, way) as tied_worker saves it,
plus the torch class, the order it loaded and this rank's stages.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from autopipe.errors import PlanError
from autopipe.schedules import schedule_spec
from autopipe.stages.export import to_torch_pipelining
from autopipe.stages.rebuild import rebuild_model
from tests.helpers import MODELS, even_plan
from tests.stages.tied_worker import BATCH, MICRO, MODEL, _train

# schedule: the model it trains. tied3's stage 1 of 2 (ZB-H2) would use the tied weight twice, which
# torch's split backward cannot take (its ScheduleInterleavedZeroBubble fails alike), so ZB-H2 trains gpt.py.
SCHEDULES = {"v-half": MODEL, "v-min": MODEL, "zb-h2": str(MODELS / "gpt.py")}
WAYS = ("export", "torch")


def plan_for(schedule: str, model: str | None = None):  # type: ignore[no-untyped-def]
    return even_plan(
        model or SCHEDULES[schedule],
        stages=2,
        virtual=2 if schedule_spec(schedule).takes_virtual else 1,
        schedule=schedule,
        micro_batches=MICRO,
        micro_batch_size=BATCH // MICRO,
        reuse_trace=True,
    )


def _built(plan: Any, rank: int) -> dict[str, Any]:
    """The torch schedule ``to_torch_pipelining`` builds and the order it loaded, per rank."""
    loaded = rebuild_model(plan)
    example = loaded.make_inputs(plan.micro_batch_size)
    stages, schedule = to_torch_pipelining(plan, loaded.model, rank, example_inputs=example, loss_fn=loaded.loss_fn)
    order = {r: [str(a) for a in acts if a is not None] for r, acts in schedule.pipeline_order.items()}
    return {"class": type(schedule).__name__, "order": order, "stages": [s.stage_index for s in stages]}


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    results: dict[str, Any] = {}
    model, schedules = (sys.argv[5], sys.argv[6:]) if len(sys.argv) > 5 else (None, list(SCHEDULES))
    for schedule in schedules:
        plan = plan_for(schedule, model)
        results[f"{schedule}/built"] = _built(plan, rank)
        for way in WAYS:
            try:
                results[f"{schedule}/{way}"] = _train(plan, way, rank)
            except PlanError as e:  # refused before any communication: every rank raises it
                results[f"{schedule}/{way}"] = {"error": str(e)}
    torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
