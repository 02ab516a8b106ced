"""``autopipe config``: the plan as Megatron-LM arguments or a torchtitan job config."""

from __future__ import annotations

import argparse

from rich.console import Console

from .args import UsageError, output_path

__all__ = ["add_config_parser"]

TARGETS = ("megatron", "torchtitan")


def add_config_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "config",
        help="print a plan as Megatron-LM arguments or a torchtitan TOML job config",
        description="Say the plan in a training framework's words: Megatron-LM command-line arguments "
        "(--for megatron) or a torchtitan job config (--for torchtitan). What the framework cannot "
        "express as the plan says is a '#' comment line.",
    )
    p.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    p.add_argument("--for", dest="target", required=True, metavar="FRAMEWORK", help="megatron or torchtitan")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of printing")
    p.set_defaults(func=cmd_config)


def cmd_config(args: argparse.Namespace, out: Console, err: Console) -> int:
    from pathlib import Path

    from autopipe._io import atomic_write_text
    from autopipe.api import megatron_config
    from autopipe.config import torchtitan_toml
    from autopipe.plans import Plan

    target = args.target.strip().lower()
    if target not in TARGETS:
        raise UsageError(
            f"--for {args.target!r} is not a framework autopipe writes for; use --for megatron or --for torchtitan"
        )
    destination = output_path(args.output, "--output") if args.output is not None else None
    plan = Plan.load(args.plan)
    text = megatron_config(plan, base=Path(args.plan).parent) if target == "megatron" else torchtitan_toml(plan)
    if destination is None:
        out.file.write(text)
        return 0
    atomic_write_text(destination, text)
    what = "Megatron-LM arguments" if target == "megatron" else "torchtitan job config"
    print(f"wrote {destination}: {what} for {plan.model}", file=out.file)
    return 0
