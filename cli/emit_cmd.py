"""``autopipe emit`` and ``autopipe merge``: parse, call :mod:`autopipe.stages.emit`, print.

Tests: tests/stages/test_emit.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from .args import UsageError, output_folder, output_path
from .progress import progress_bar

__all__ = ["add_emit_parsers"]


def add_emit_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "emit",
        help="write a plan's stages as standalone folders (torch-only source + weights + manifest.json)",
        description="Rebuild the plan's model, split it by the plan and write one folder per stage.",
    )
    p.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write (must be new or empty)")
    p.add_argument("--force", action="store_true", help="replace DIR if it is not empty")
    p.add_argument("--no-weights", action="store_true", help="structure only: build on meta, write no weights")
    p.add_argument(
        "--weights", default=None, metavar="FILE", help="take weights from this state_dict (torch.save or .safetensors)"
    )
    p.add_argument("--format", default="pt", choices=("pt", "safetensors"), help="weights file format (default: pt)")
    p.set_defaults(func=cmd_emit)

    m = commands.add_parser(
        "merge",
        help="rebuild the original model's state_dict from emitted stage folders",
        description="Read the stage folders and manifest.json that autopipe emit wrote to DIR and save the "
        "original model's state_dict (its keys, in order, bit for bit) to FILE with torch.save.",
    )
    m.add_argument("folder", metavar="DIR", help="folder written by autopipe emit")
    m.add_argument("-o", "--output", required=True, metavar="FILE", help="state_dict file to write (torch.save)")
    m.set_defaults(func=cmd_merge)


def cmd_emit(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.plans import Plan
    from autopipe.stages.emit import check_destination, emit

    if args.no_weights and args.weights is not None:
        raise UsageError("--no-weights and --weights contradict each other; give one")
    output_folder(args.output, "--output")
    plan = Plan.load(args.plan)
    check_destination(args.output, args.force)  # before the slow part
    with progress_bar(err) as progress:
        manifest = emit(
            plan,
            args.output,
            force=args.force,
            weights=not args.no_weights,
            state_dict=args.weights,
            weights_format=args.format,
            base=Path(args.plan).parent,
            progress=progress,
        )
    n = len(manifest["stages"])
    skips = sum(1 for t in manifest["transfers"] if t["skip"])
    what = "no weights" if manifest["weights"] is None else f"weights as .{manifest['weights']}"
    extra = f", {skips} skip connection(s)" if skips else ""
    print(f"wrote {args.output}: {n} stage folder(s) and manifest.json ({what}{extra})", file=out.file)
    return 0


def cmd_merge(args: argparse.Namespace, out: Console, err: Console) -> int:
    import torch

    from autopipe._io import atomic_write
    from autopipe.stages.merge import merge_state_dict

    target = output_path(args.output, "--output")
    state = merge_state_dict(args.folder)
    atomic_write(target, lambda tmp: torch.save(state, tmp))
    print(f"wrote {target}: {len(state)} tensors (the model's state_dict)", file=out.file)
    return 0
