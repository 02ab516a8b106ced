"""One rank of the torchtitan schedule-CSV test (tests/config/test_titan_csv.py).

    python tests/config/titan_csv_worker.py RANK WORLD PORT OUT.pt DIR MODULE...

For each recipe MODULE (written by ``autopipe config --for torchtitan``, in DIR with the schedule
CSV it names): torchtitan's own ConfigManager reads it, torchtitan's ``_pipeline_module_split``
builds this rank's stages of :class:`Tiny` (a model named as torchtitan's llama3 is, whose forward
takes the deleted modules, as torchtitan's models do) by the recipe's module names and schedule,
and torchtitan's ``_build_pipeline_schedule`` builds the schedule, which ``_load_csv``\\s the CSV
the recipe points at. One step: saved are the schedule class, the order it loaded, the
micro-batch losses (last stage) and this rank's gradients.
"""

from __future__ import annotations

import datetime
import inspect
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

VOCAB, WIDTH, LAYERS, BATCH, MICRO, SEQ = 32, 16, 4, 8, 4, 5


class Tiny(nn.Module):
    """tok_embeddings, layers.0-3, norm, output; a deleted module (None, or an empty list) is skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings: nn.Module | None = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        self.norm: nn.Module | None = nn.LayerNorm(WIDTH)
        self.output: nn.Module | None = nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers:
            h = h + torch.tanh(layer(h))
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def data() -> tuple[Tiny, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Tiny()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    return model, tokens, torch.roll(tokens, -1, dims=1)


def loss_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def _run(module: str, rank: int, mesh: Any) -> dict[str, Any]:
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import pipeline_parallel as tt_pp

    config = ConfigManager().parse_args(["--module", module, "--config", "autopipe_plan"])
    par = config.parallelism
    model, tokens, labels = data()
    stages, _ = tt_pp._pipeline_module_split(
        model, mesh, par.pipeline_parallel_schedule, torch.device("cpu"), par.module_fqns_per_model_part
    )
    kwargs: dict[str, Any] = {"parallelism": par, "stages": stages, "loss_fn": lambda out, y: (loss_of(out, y), None)}
    if "local_batch_size" in inspect.signature(tt_pp._build_pipeline_schedule).parameters:  # 0.3.0
        kwargs["local_batch_size"] = config.training.local_batch_size
    else:  # main: a micro-batch count
        kwargs["num_microbatches"] = par.num_pp_microbatches
    schedule = tt_pp._build_pipeline_schedule(**kwargs)
    losses: list[torch.Tensor] = []
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    schedule.step(*((tokens,) if first else ()), target=labels if last else None, losses=losses if last else None)
    grads = {
        f"{s.stage_index}:{n}": p.grad.detach().clone()
        for s in stages
        for n, p in s.submod.named_parameters()
        if p.grad is not None
    }
    order = {r: [str(a) for a in acts if a is not None] for r, acts in schedule.pipeline_order.items()}
    return {
        "class": type(schedule).__name__,
        "placement": par.pipeline_parallel_schedule,
        "csv": par.pipeline_parallel_schedule_csv,
        "order": order,
        "stages": [s.stage_index for s in stages],
        "losses": [float(x) for x in losses],
        "grads": grads,
    }


def main() -> None:
    rank, world, port, out, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    mesh = dist.device_mesh.init_device_mesh("cpu", (world,), mesh_dim_names=("pp",))
    sys.path.insert(0, folder)
    os.chdir(folder)  # the recipes name their CSV relative to where torchtitan runs
    results = {module: _run(module, rank, mesh) for module in sys.argv[6:]}
    torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
