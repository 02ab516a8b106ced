"""``autopipe run``: execute a plan on local processes and print measured against predicted.

The run flags and their defaults are defined once, in :mod:`autopipe.runtime.options`
(``python -m autopipe.runtime`` takes the same); ``--json`` is this command's own.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from autopipe.runtime.options import add_run_arguments

from .args import output_path

__all__ = ["add_run_parser"]


def add_run_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "run", help="train with a plan on this machine; print measured vs predicted times",
        description="Start one process per pipeline device (gloo on CPU, NCCL on GPUs), run PLAN for --steps "
        "optimizer steps and print each stage's measured time, the bubble, iteration time and memory beside "
        "the plan's prediction. Across machines use: torchrun ... -m autopipe.runtime PLAN.",
    )  # fmt: skip
    add_run_arguments(p)
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.runtime.options import run_options

    options = run_options(args)
    if args.trace:
        output_path(args.trace, "--trace")
    from autopipe.plans import Plan
    from autopipe.runtime.launch import launch
    from autopipe.runtime.report import compare, format_report, write_chrome_trace
    from autopipe.stages.rebuild import check_rebuildable

    plan = Plan.load(args.plan)
    check_rebuildable(plan)  # a plan of an in-memory module: say so here, not from every rank
    result = launch(args.plan, options)
    if args.trace:
        write_chrome_trace(result, args.trace)
    if args.json:
        rows = [{"what": r.what, "predicted": r.predicted, "measured": r.measured, "unit": r.unit,
                 "error_pct": r.error_pct} for r in compare(plan, result)]  # fmt: skip
        print(json.dumps({"losses": list(result.losses), "report": rows}, indent=1), file=out.file)
    else:
        print(format_report(plan, result), file=out.file)
    return 0
