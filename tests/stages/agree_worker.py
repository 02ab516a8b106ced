"""Ranks of the hash-order test (tests/stages/test_agree.py): one process, one PYTHONHASHSEED.

    PYTHONHASHSEED=s python tests/stages/agree_worker.py PLAN.json OUT_DIR ME N PORTS [SKEW]

``N`` such processes (``ME`` = 0 .. N-1, each started with its own seed) run every pair
(i, j), i < j, in one fixed order, i as rank 0 and j as rank 1 of a 2-rank process group on
``127.0.0.1:PORTS[k]`` for the k-th pair: each run sets ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` as torchrun would and lets :class:`Pipeline` start the group;
so 5 processes give 10 seed pairs for the cost of 5 interpreters. Per pair: tests/fixtures/hash_order.py
trained ``STEPS`` SGD steps on both engines, one after the other; the losses and this rank's
state saved per engine in OUT_DIR/pair{k}-rank{r}.pt. ``SKEW``: process 1 builds the model with
another constant (it traced another model): the one-line error is printed (``RANK-MISMATCH: ...``)
and saved.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from autopipe.errors import RankMismatchError
from autopipe.model.load import load_model
from autopipe.plans import Plan
from autopipe.runtime.pipeline import Pipeline
from tests.helpers import FIXTURES

MODEL = str(FIXTURES / "hash_order.py")
STEPS = 3
LR = 0.2


def pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def train(plan: Plan, rank: int, skew: float) -> dict[str, object]:
    """Both engines, one after the other, in the process group the first one starts."""
    results: dict[str, object] = {}
    try:
        for engine in ("autopipe", "torch"):
            torch.manual_seed(0)
            loaded = load_model(MODEL, {"skew": skew})
            pipe = Pipeline(
                plan,
                loaded.model,
                rank=rank,
                example_inputs=loaded.make_inputs(plan.micro_batch_size),
                loss_fn=loaded.loss_fn,
                device="cpu",
                engine=engine,
                timeout_s=60.0,
            )
            opt = torch.optim.SGD(pipe.parameters(), lr=LR)
            x, y = loaded.make_inputs(plan.batch_size), loaded.make_targets(plan.batch_size)  # type: ignore[misc]
            losses = []
            for _ in range(STEPS):
                losses.append(pipe.step(x, y))
                opt.step()
                opt.zero_grad()
            results[engine] = {"losses": losses, "state": {k: v.detach().clone() for k, v in pipe.state_dict().items()}}
    except RankMismatchError as e:
        print(f"RANK-MISMATCH: {e}", flush=True)
        results["error"] = str(e)
    return results


def main() -> None:
    torch.set_num_threads(1)
    plan, out, me, n, ports = Plan.load(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    skew = float(sys.argv[6]) if len(sys.argv) > 6 and me == 1 else 0.0
    for k, (i, j) in enumerate(pairs(n)):
        if me not in (i, j):
            continue
        rank = 0 if me == i else 1
        port = ports.split(",")[k]
        os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        torch.save(train(plan, rank, skew), out / f"pair{k}-rank{rank}.pt")
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
