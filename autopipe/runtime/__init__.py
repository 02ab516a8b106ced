"""The built-in pipeline executor: run a Plan on torch.distributed, measured against it.

    from autopipe.runtime import RunOptions
    from autopipe.runtime.launch import launch
    from autopipe.runtime.report import format_report
    result = launch("plan.json", RunOptions(steps=10))        # S local processes, gloo
    print(format_report(Plan.load("plan.json"), result))

Modules: ``engine`` (one rank's actions: F, B, W, sends and receives), ``routing`` (who sends
what to whom), ``shapes`` (the shape pass), ``microbatch``, ``comm`` (torch.distributed or
threads), ``worker`` (one rank: rebuild, split, train), ``launch`` (processes on this machine,
fault handling), ``local`` (threads), ``checkpoint``, ``report`` (measured vs predicted,
Chrome trace). ``python -m autopipe.runtime plan.json`` is the torchrun entry point.
"""

from autopipe.runtime.checkpoint import assemble_state_dict
from autopipe.runtime.engine import ActionRecord, IterationResult, PipelineEngine
from autopipe.runtime.local import run_threads
from autopipe.runtime.options import RunOptions
from autopipe.runtime.worker import RankResult, Rebuilt, rebuild, train_rank

__all__ = [
    "ActionRecord",
    "IterationResult",
    "PipelineEngine",
    "RankResult",
    "Rebuilt",
    "RunOptions",
    "assemble_state_dict",
    "rebuild",
    "run_threads",
    "train_rank",
]
