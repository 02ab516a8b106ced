"""``autopipe config``: the plan as Megatron-LM arguments, a torchtitan 0.3.0 recipe or a torchtitan 0.2.x TOML."""

from __future__ import annotations

import argparse

from rich.console import Console

from .args import UsageError, output_path

__all__ = ["add_config_parser"]

TARGETS = ("megatron", "torchtitan", "torchtitan-0.2")
WHAT = {
    "megatron": "Megatron-LM arguments",
    "torchtitan": "torchtitan 0.3.0 recipe module",
    "torchtitan-0.2": "torchtitan 0.2.x job config (TOML)",
}


def add_config_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "config",
        help="print a plan as Megatron-LM arguments or a torchtitan job config",
        description="Say the plan in a training framework's words: Megatron-LM command-line arguments "
        "(--for megatron), a torchtitan 0.3.0 recipe module, Python, for its --module/--config (--for torchtitan), "
        "or a torchtitan 0.2.x TOML job config (--for torchtitan-0.2). What the framework cannot "
        "express as the plan says is a '#' comment line.",
    )
    p.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    p.add_argument(
        "--for",
        dest="target",
        required=True,
        metavar="FRAMEWORK",
        help="megatron, torchtitan (0.3.0) or torchtitan-0.2",
    )
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of printing")
    p.set_defaults(func=cmd_config)


def cmd_config(args: argparse.Namespace, out: Console, err: Console) -> int:
    from pathlib import Path

    from autopipe._io import atomic_write_text
    from autopipe.api import megatron_config
    from autopipe.config import torchtitan_recipe, torchtitan_toml
    from autopipe.plans import Plan

    target = args.target.strip().lower()
    if target not in TARGETS:
        raise UsageError(
            f"--for {args.target!r} is not a framework autopipe writes for; "
            "use --for megatron, --for torchtitan or --for torchtitan-0.2"
        )
    destination = output_path(args.output, "--output") if args.output is not None else None
    plan = Plan.load(args.plan)
    if target == "megatron":
        text = megatron_config(plan, base=Path(args.plan).parent)
    elif target == "torchtitan-0.2":
        text = torchtitan_toml(plan)
    else:  # the launch line names the module as the file is saved
        stem = destination.stem if destination is not None else "autopipe_recipe"
        text = torchtitan_recipe(plan, module=stem if stem.isidentifier() else "autopipe_recipe")
    if destination is None:
        out.file.write(text)
        return 0
    atomic_write_text(destination, text)
    print(f"wrote {destination}: {WHAT[target]} for {plan.model}", file=out.file)
    return 0
