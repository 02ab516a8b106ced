"""``autopipe run``: execute a plan on local processes and print measured against predicted."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from autopipe.units import parse_duration

from .args import (
    UsageError,
    non_negative_int,
    output_path,
    positive_int,
)

__all__ = ["add_run_parser"]


def add_run_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "run", help="train with a plan on this machine; print measured vs predicted times",
        description="Start one process per pipeline device (gloo on CPU, NCCL on GPUs), run PLAN for --steps "
        "optimizer steps and print each stage's measured time, the bubble, iteration time and memory beside "
        "the plan's prediction. Across machines use: torchrun ... -m autopipe.runtime PLAN.",
    )  # fmt: skip
    p.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    p.add_argument("--steps", default="10", metavar="N", help="optimizer steps (default: 10)")
    p.add_argument(
        "--timeout",
        default="60",
        metavar="SECONDS",
        help="timeout of every send/receive/collective (default: 60)",
    )
    p.add_argument(
        "--seed", default="0", metavar="N", help="seed for weights and batches (default: 0)"
    )
    p.add_argument("--optimizer", default="Adam", help="torch.optim class (default: Adam)")
    p.add_argument("--lr", default="1e-3", help="learning rate (default: 1e-3)")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="cpu (gloo) or cuda (NCCL) (default: cuda if available)",
    )
    p.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help="write a Chrome trace (chrome://tracing, Perfetto)",
    )
    p.add_argument(
        "--save-checkpoint",
        default=None,
        metavar="DIR",
        help="save weights and optimizer state after the run",
    )
    p.add_argument("--resume", default=None, metavar="DIR", help="continue from a checkpoint")
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace, out: Console, err: Console) -> int:
    steps = positive_int(args.steps, "--steps")
    timeout = parse_duration(args.timeout, "--timeout")
    seed = non_negative_int(args.seed, "--seed")
    try:
        lr = float(args.lr)
    except ValueError:
        raise UsageError(f"--lr must be a number (got {args.lr!r})") from None
    if args.trace:
        output_path(args.trace, "--trace")
    import torch

    from autopipe.plans import Plan
    from autopipe.runtime import RunOptions
    from autopipe.runtime.launch import launch
    from autopipe.runtime.report import compare, format_report, write_chrome_trace

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    plan = Plan.load(args.plan)
    options = RunOptions(
        steps=steps, seed=seed, optimizer=args.optimizer, lr=lr, timeout_s=timeout, device=device,
        save_checkpoint=args.save_checkpoint, resume=args.resume,
    )  # fmt: skip
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
