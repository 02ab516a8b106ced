"""One rank of the zero-bubble export test (tests/stages/test_zero_bubble_export.py, issue 27).

    python tests/stages/zb_worker.py RANK WORLD PORT OUT.pt PLAN.json [PLAN.json ...]

Trains each plan's model (tests/fixtures/hf_zoo.py, rebuilt seeded) ``STEPS`` SGD steps on gloo
through ``to_torch_pipelining`` in docs/outlets.md's loop. Saves per plan the per-step losses
(the mean over micro-batches, on the last rank) and the parameters this rank's stages hold (by
the model's names), or the first line of the error construction or training raised.
"""

from __future__ import annotations

import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist

from autopipe.plans import Plan
from autopipe.stages.export import pipeline_inputs, sync_shared_grads, to_torch_pipelining
from autopipe.stages.rebuild import rebuild_model

STEPS = 3
LR = 0.1


def main() -> None:
    rank, world, port, out, plans = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    seconds = int(os.environ.get("ZB_TIMEOUT", "60"))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=seconds))
    results: dict[str, dict[str, object]] = {}
    for path in plans:
        try:
            results[path] = _train(Plan.load(path), rank)
        except Exception as e:  # the test reads the error
            if os.environ.get("ZB_TRACEBACK"):
                traceback.print_exc()
            results[path] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def _train(plan: Plan, rank: int) -> dict[str, object]:
    loaded = rebuild_model(plan)
    model = loaded.model
    x, y = loaded.make_inputs(plan.batch_size), loaded.make_targets(plan.batch_size)  # type: ignore[misc]
    example = loaded.make_inputs(plan.micro_batch_size)
    stages, schedule = to_torch_pipelining(plan, model, rank, example_inputs=example, loss_fn=loaded.loss_fn)
    params = list({id(p): p for s in stages for p in s.submod.parameters()}.values())
    optimizer = torch.optim.SGD(params, lr=LR)
    last = stages[-1].is_last
    step_losses: list[float] = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        schedule.step(*pipeline_inputs(stages, x), target=y if last else None, losses=losses if last else None)
        sync_shared_grads(stages)
        optimizer.step()
        if last:
            step_losses.append(float(torch.stack(losses).detach().mean()))
    held = {id(p) for p in params}
    return {
        "losses": step_losses,
        "params": {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in held},
    }


if __name__ == "__main__":
    main()
