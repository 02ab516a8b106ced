"""One rank of the three-way tie test (tests/stages/test_export.py, issue 29).

    python tests/stages/tied_worker.py RANK WORLD PORT OUT.pt

tests/fixtures/tied3.py (encoder embedding, decoder embedding and LM head: one Parameter) trains
STEPS SGD steps under every schedule of SCHEDULES, five ways each: ``autopipe.pipeline`` with
the autopipe engine, with the torch engine, ``to_torch_pipelining`` in docs/outlets.md's own
loop, and either engine with each batch stepped twice before the optimizer's step at half
the learning rate (gradients accumulate over steps as ``loss.backward()``'s do). Saved per
(schedule, way): the losses, the parameters this rank's stages hold (by the model's names) and,
through ``autopipe.pipeline``, the rank's ``pipe.state_dict()``; or the PlanError construction raised.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from autopipe import pipeline
from autopipe.errors import PlanError
from autopipe.stages.export import pipeline_inputs, sync_shared_grads, to_torch_pipelining
from autopipe.stages.rebuild import rebuild_model
from tests.helpers import FIXTURES, even_plan

MODEL = str(FIXTURES / "tied3.py")
SCHEDULES = ("interleaved-1f1b", "zb-v", "dualpipe-v")
WAYS = ("autopipe", "torch", "export", "autopipe-twice", "torch-twice")
STEPS, LR, BATCH, MICRO = 3, 0.5, 8, 4


def plan_for(schedule: str):  # type: ignore[no-untyped-def]
    return even_plan(
        MODEL, stages=2, virtual=2, schedule=schedule, micro_batches=MICRO, micro_batch_size=BATCH // MICRO
    )


def batches(loaded: Any) -> list[tuple[Any, torch.Tensor]]:
    """tests.helpers.reference_training's batches: the RNG seeded k + 1 before step k's."""
    out = []
    for k in range(STEPS):
        torch.manual_seed(k + 1)
        out.append((loaded.make_inputs(BATCH), loaded.make_targets(BATCH)))
    return out


def _train(plan: Any, way: str, rank: int) -> dict[str, Any]:
    loaded = rebuild_model(plan)
    model, data = loaded.model, batches(loaded)
    example = loaded.make_inputs(plan.micro_batch_size)
    losses: list[float] = []
    if way == "export":
        stages, schedule = to_torch_pipelining(plan, model, rank, example_inputs=example, loss_fn=loaded.loss_fn)
        params = list({id(p): p for s in stages for p in s.submod.parameters()}.values())
        opt = torch.optim.SGD(params, lr=LR)
        for x, y in data:
            opt.zero_grad()
            mine: list[torch.Tensor] = []
            last = stages[-1].is_last
            schedule.step(*pipeline_inputs(stages, x), target=y if last else None, losses=mine)
            sync_shared_grads(stages)
            opt.step()
            losses += [float(torch.stack(mine).mean())] if last else []
    else:  # *-twice: every batch stepped twice before the optimizer's step at half the rate
        engine, repeat = way.removesuffix("-twice"), 2 if way.endswith("-twice") else 1
        pipe = pipeline(plan, model, rank=rank, example_inputs=example, loss_fn=loaded.loss_fn, engine=engine)
        params = list(pipe.parameters())
        opt = torch.optim.SGD(params, lr=LR / repeat)
        for x, y in data:
            for _ in range(repeat):  # the gradients accumulate: twice the batch's
                loss = pipe.step(x, y)
            losses.append(loss)
            opt.step()
            opt.zero_grad()
    held = {id(p) for p in params}
    state = {k: v.clone() for k, v in pipe.state_dict().items()} if way != "export" else {}
    kept = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in held}
    return {"losses": losses, "params": kept, "state": state}


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    results: dict[str, Any] = {}
    for schedule in SCHEDULES:
        plan = plan_for(schedule)
        results[f"{schedule}/placement"] = [s.rank for s in plan.stages]
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
