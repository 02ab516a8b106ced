"""One gloo rank that trains a list of plans in sequence (tests/test_runtime.py's process tests).

    python -m tests.runtime.gloo_worker JOBS.json OUT_DIR      # RANK, WORLD_SIZE, MASTER_* from the env

Starting a process costs seconds (importing torch, transformers, tracing), so one launch of
``WORLD_SIZE`` processes runs every job of JOBS.json (``[{"name": ..., "plan": path}]``) in
one process group: the same ``train_rank`` and :class:`~autopipe.runtime.comm.DistComm` as
``python -m autopipe.runtime``, a fresh copy of the traced model per job (each model is
rebuilt once per process). Each job saves a checkpoint to ``OUT_DIR/<name>``; each rank
writes the losses it saw to ``OUT_DIR/losses-<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from autopipe.plans import Plan
from autopipe.runtime import RunOptions, train_rank
from autopipe.runtime.comm import Comm, DistComm
from autopipe.runtime.run.worker import Rebuilt, rebuild

STEPS, LR, TIMEOUT_S = 3, 0.1, 60.0


def main() -> None:
    jobs, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=TIMEOUT_S))
    models: dict[tuple[str, tuple[str, ...], int], Rebuilt] = {}
    losses: dict[str, list[float]] = {}
    for job in jobs:
        plan = Plan.load(job["plan"])
        key = (plan.recipe.model_file, plan.recipe.model_kwargs, plan.micro_batch_size)
        if key not in models:
            models[key] = rebuild(plan)
        options = RunOptions(
            steps=STEPS,
            optimizer="SGD",
            lr=LR,
            timeout_s=TIMEOUT_S,
            save_checkpoint=str(out / job["name"]),
        )

        def comm(groups: list[tuple[int, ...]]) -> Comm:
            return DistComm(TIMEOUT_S, groups)

        result = train_rank(plan, rank, comm, options, models[key].copy())
        losses[job["name"]] = [it.loss for it in result.iterations if it.loss is not None]
    (out / f"losses-{rank}.json").write_text(json.dumps(losses))
    dist.barrier()
    os._exit(0)  # skip process-group teardown


if __name__ == "__main__":
    main()
