"""``autopipe emit`` and ``autopipe merge``: parse, call :mod:`autopipe.stages.emit` (and
:mod:`autopipe.stages.schedule_csv`), print.

Tests: tests/stages/test_emit.py.
Tests: tests/stages/test_schedule_csv.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from .args import UsageError, output_folder, output_path
from .common import add_load_timeout_argument
from .progress import progress_bar

__all__ = ["add_emit_parsers"]


def add_emit_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "emit",
        help="write a plan's stages as standalone folders (torch-only source + weights + manifest.json)",
        description="Rebuild the plan's model, split it by the plan and write one folder per stage; with "
        "--schedule-csv, also (or only) write the plan's schedule as the CSV stock PyTorch runs.",
    )
    p.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    p.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="DIR",
        help="folder to write (must be new or empty); needed without --schedule-csv",
    )
    p.add_argument("--force", action="store_true", help="replace DIR if it is not empty")
    p.add_argument("--no-weights", action="store_true", help="structure only: build on meta, write no weights")
    p.add_argument(
        "--weights", default=None, metavar="FILE", help="take weights from this state_dict (torch.save or .safetensors)"
    )
    p.add_argument("--format", default="pt", choices=("pt", "safetensors"), help="weights file format (default: pt)")
    p.add_argument(
        "--schedule-csv",
        default=None,
        metavar="FILE",
        help="write the plan's per-rank action order as the CSV torch.distributed.pipelining's "
        "_PipelineScheduleRuntime._load_csv reads (torchtitan: pipeline_parallel_schedule_csv)",
    )
    add_load_timeout_argument(p)
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
    if args.output is None and args.schedule_csv is None:
        raise UsageError("emit writes stage folders (-o DIR), a schedule CSV (--schedule-csv FILE) or both; give one")
    if args.output is not None:
        output_folder(args.output, "--output")  # before anything is written
        check_destination(args.output, args.force, keep=(args.plan, args.weights))  # and before the slow part
    plan = Plan.load(args.plan)
    if args.schedule_csv is not None:
        from autopipe.stages.schedule_csv import write_schedule_csv

        target = write_schedule_csv(plan, args.schedule_csv, "--schedule-csv")
        print(f"wrote {target}: the {plan.schedule} schedule, {plan.devices} rank row(s)", file=out.file)
        if args.output is None:
            return 0
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
    from autopipe._io import atomic_write, torch_save
    from autopipe.stages.merge import merge_state_dict

    target = output_path(args.output, "--output", "model.pt")
    state = merge_state_dict(args.folder)
    atomic_write(target, lambda tmp: torch_save(state, tmp))
    print(f"wrote {target}: {len(state)} tensors (the model's state_dict)", file=out.file)
    return 0
