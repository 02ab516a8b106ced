"""One rank of the torch.distributed.pipelining export test (tests/test_export.py).

    python tests/stages/export_worker.py RANK WORLD PORT OUT.pt

Trains every CONFIGS entry 3 steps through ``to_torch_pipelining`` on gloo and saves, per
config, the parameters this rank's stages hold (by the model's names).
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

from autopipe.stages.export import sync_shared_grads, to_torch_pipelining
from autopipe.stages.rebuild import rebuild_model
from tests.helpers import even_plan

CONFIGS = {  # name: (model file, schedule, virtual stages per rank, micro-batches, micro-batch size)
    "gpt-1f1b": ("gpt.py", "1f1b", 1, 2, 2),
    "gpt-interleaved": ("gpt.py", "interleaved-1f1b", 2, 2, 2),
    "unet-interleaved": ("unet.py", "interleaved-1f1b", 2, 2, 2),
    "mlp-gpipe": ("mlp.py", "gpipe", 1, 4, 2),
    "mlp-zb": ("mlp.py", "zb-h1", 1, 2, 2),
    "mlp-zbv": ("mlp.py", "zb-v", 2, 4, 2),
    "mlp-dualpipev": ("mlp.py", "dualpipe-v", 2, 4, 2),
}
STEPS = 3
LR = 0.1


def plan_for(name: str, world: int):  # type: ignore[no-untyped-def]
    model, schedule, virtual, m, u = CONFIGS[name]
    # reuse_trace: one trace per model and micro-batch size (gpt.py twice, mlp.py four times),
    # here and in the test's reference, which asks for every plan twice
    return even_plan(
        model, stages=world, virtual=virtual, schedule=schedule, micro_batches=m, micro_batch_size=u, reuse_trace=True
    )


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    results = {}
    for name in CONFIGS:
        plan = plan_for(name, world)
        loaded = rebuild_model(plan)
        model = loaded.model
        x, y = loaded.make_inputs(plan.batch_size), loaded.make_targets(plan.batch_size)  # type: ignore[misc]
        stages, schedule = to_torch_pipelining(
            plan, model, rank, example_inputs=loaded.make_inputs(plan.micro_batch_size), loss_fn=loaded.loss_fn
        )
        params = list({id(p): p for s in stages for p in s.submod.parameters()}.values())
        optimizer = torch.optim.SGD(params, lr=LR)
        first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
        for _ in range(STEPS):
            optimizer.zero_grad()
            args = (x,) if first else ()
            schedule.step(*args, target=y if last else None)
            sync_shared_grads(stages)
            optimizer.step()
        held = {id(p) for p in params}
        results[name] = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in held}
    torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
