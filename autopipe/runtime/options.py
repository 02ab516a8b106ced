"""The options of a pipeline run (``autopipe run`` flags, ``run_plan`` keywords)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    steps: int = 1  # optimizer steps to run (after those of a resumed checkpoint)
    seed: int = 0  # weights: torch.manual_seed(seed) before the factory; batches: seed + step + 1
    optimizer: str = "Adam"  # a torch.optim class name
    lr: float = 1e-3
    optimizer_kwargs: tuple[tuple[str, float], ...] = ()  # extra constructor arguments
    timeout_s: float = 60.0  # every send, receive and collective; and starting the group
    device: str = "cpu"  # "cpu" (gloo) or "cuda" (NCCL, device cuda:LOCAL_RANK)
    threads: int = 1  # torch.set_num_threads per rank
    save_checkpoint: str | None = None  # folder written after the last step
    resume: str | None = None  # folder to continue from
    model_base: str | None = None  # where to look for a relative model_file besides the cwd (the plan's folder)
