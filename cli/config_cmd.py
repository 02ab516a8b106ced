"""``autopipe config``: the plan as Megatron-LM arguments, a torchtitan 0.3.0 or main recipe or a torchtitan 0.2.x TOML,
checked with ``--check MODEL`` against the model the user will train."""

from __future__ import annotations

import argparse

from rich.console import Console

from .args import UsageError, output_path
from .common import add_load_timeout_argument

__all__ = ["add_config_parser"]

TARGETS = ("megatron", "torchtitan", "torchtitan-main", "torchtitan-0.2")
WHAT = {
    "megatron": "Megatron-LM arguments",
    "torchtitan": "torchtitan 0.3.0 recipe module",
    "torchtitan-main": "torchtitan main recipe module",
    "torchtitan-0.2": "torchtitan 0.2.x job config (TOML)",
}


def add_config_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "config",
        help="print a plan as Megatron-LM arguments or a torchtitan job config",
        description="Say the plan in a training framework's words: Megatron-LM command-line arguments "
        "(--for megatron), a torchtitan 0.3.0 recipe module, Python that torchtitan imports by name "
        "(--for torchtitan), "
        "the same for torchtitan's main branch, which counts batches in tokens (--for torchtitan-main), "
        "or a torchtitan 0.2.x TOML job config (--for torchtitan-0.2). What the framework cannot "
        "express as the plan says is a '#' comment line.",
    )
    p.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    p.add_argument(
        "--for",
        dest="target",
        required=True,
        metavar="FRAMEWORK",
        help="megatron, torchtitan (0.3.0), torchtitan-main or torchtitan-0.2",
    )
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE instead of printing")
    p.add_argument(
        "--check",
        default=None,
        metavar="MODEL",
        help="first check the config against the model you will train, a model file (path/to/model.py[:factory], "
        "built on the meta device): torchtitan: every module name exists and the parts hold all its weights; "
        "megatron: its layer list and layer count. A mismatch is one line, exit 2, nothing written",
    )
    p.add_argument(
        "-k",
        dest="kwargs",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="factory keyword argument of the --check model (repeatable)",
    )
    add_load_timeout_argument(p)
    p.set_defaults(func=cmd_config)


def cmd_config(args: argparse.Namespace, out: Console, err: Console) -> int:
    from pathlib import Path

    from autopipe._io import atomic_write_text
    from autopipe.api import check_config, megatron_config, parse_kwargs
    from autopipe.config import torchtitan_recipe, torchtitan_toml
    from autopipe.config.torchtitan import TORCHTITAN_VERSION
    from autopipe.errors import ConfigError
    from autopipe.plans import Plan

    target = args.target.strip().lower()
    if target not in TARGETS:
        raise UsageError(
            f"--for {args.target!r} is not a framework autopipe writes for; "
            "use --for megatron, --for torchtitan, --for torchtitan-main or --for torchtitan-0.2"
        )
    if args.kwargs and args.check is None:
        raise UsageError("-k gives the --check model's factory arguments; add --check MODEL, or drop -k")
    example = (
        "megatron-args.txt"
        if target == "megatron"
        else "titan.toml"
        if target == "torchtitan-0.2"
        else "autopipe_recipe.py"
    )
    destination = output_path(args.output, "--output", example) if args.output is not None else None
    plan = Plan.load(args.plan)
    if target == "megatron":
        text = megatron_config(plan, base=Path(args.plan).parent)
    elif target == "torchtitan-0.2":
        text = torchtitan_toml(plan, plan_file=args.plan)
    else:  # the launch line names the module as the file is saved
        stem = destination.stem if destination is not None else "autopipe_recipe"
        module = stem if stem.isidentifier() else "autopipe_recipe"
        version = "main" if target == "torchtitan-main" else TORCHTITAN_VERSION
        text = torchtitan_recipe(plan, module=module, version=version, plan_file=args.plan)
    if args.check is not None:
        try:
            check_config(plan, args.check, kwargs=parse_kwargs(args.kwargs), target=target, base=Path(args.plan).parent)
        except ConfigError as e:
            raise ConfigError(f"--check {e}") from None
    if destination is None:
        out.file.write(text)
        return 0
    atomic_write_text(destination, text)
    print(f"wrote {destination}: {WHAT[target]} for {plan.model}", file=out.file)
    return 0
