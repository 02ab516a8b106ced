"""One rank of the hash-order test (tests/stages/test_agree.py), started with its own environment.

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p PYTHONHASHSEED=s \\
        python tests/stages/agree_worker.py PLAN.json OUT.pt [SKEW]

Trains tests/fixtures/hash_order.py ``STEPS`` SGD steps through :class:`Pipeline` on both
engines, one after the other in the same process group, and saves per engine the losses and
this rank's state. ``SKEW`` builds this rank's model with another constant (the ranks then
traced different models): the one-line error is printed (``RANK-MISMATCH: ...``) and saved.
"""

from __future__ import annotations

import os
import sys

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


def main() -> None:
    torch.set_num_threads(1)
    plan, out = Plan.load(sys.argv[1]), sys.argv[2]
    skew = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    rank = int(os.environ["RANK"])
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
                timeout_s=30.0,
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
    torch.save(results, out)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
