"""The built-in pipeline executor: run a Plan on torch.distributed, measured against it.

    from autopipe.runtime import RunOptions
    from autopipe.runtime.run.launch import launch
    from autopipe.runtime.run.report import format_report
    result = launch("plan.json", RunOptions(steps=10))        # S local processes, gloo
    print(format_report(Plan.load("plan.json"), result))

Modules: ``engine`` (one rank's actions: F, B, W, sends and receives), ``routing`` (who sends
what to whom), ``shapes`` (the shape pass), ``microbatch``, ``comm`` (torch.distributed or
threads), ``pipeline`` (one rank's stages for a training loop: ``autopipe.pipeline``),
``checkpoint`` (the format, resume, the whole model's state_dict), ``commit`` (saving, with
its commit point); the ``autopipe run`` harness is
:mod:`autopipe.runtime.run` (options, launch, threads, one rank's process, the report).
``python -m autopipe.runtime plan.json`` is the torchrun entry point.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autopipe.runtime.checkpoint import assemble_state_dict
    from autopipe.runtime.engine import ActionRecord, IterationResult, PipelineEngine
    from autopipe.runtime.pipeline import Pipeline
    from autopipe.runtime.run.local import run_threads
    from autopipe.runtime.run.options import RunOptions
    from autopipe.runtime.run.worker import RankResult, Rebuilt, rebuild, train_rank

# Imported on first use, so that the run flags (runtime.options, which `autopipe --help`
# builds) do not wait for torch.
_LAZY = {
    "assemble_state_dict": "checkpoint",
    "ActionRecord": "engine",
    "IterationResult": "engine",
    "PipelineEngine": "engine",
    "run_threads": "run.local",
    "RunOptions": "run.options",
    "Pipeline": "pipeline",
    "RankResult": "run.worker",
    "Rebuilt": "run.worker",
    "rebuild": "run.worker",
    "train_rank": "run.worker",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(f"autopipe.runtime.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'autopipe.runtime' has no attribute {name!r}")


__all__ = [
    "ActionRecord",
    "IterationResult",
    "Pipeline",
    "PipelineEngine",
    "RankResult",
    "Rebuilt",
    "RunOptions",
    "assemble_state_dict",
    "rebuild",
    "run_threads",
    "train_rank",
]
