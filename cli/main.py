"""The ``autopipe`` command: parse arguments, call the library, print, map errors to exit codes.

No planning logic lives here. Exit codes, decided in one place (:func:`main`):

- 0 success;
- 1 a pipeline run failed (``autopipe run``: a rank raised, died or timed out):
  :class:`autopipe.errors.RuntimeFailure`, printed as one ``autopipe: error:`` line naming the rank;
- 2 bad input: any :class:`autopipe.errors.AutopipeError` prints ``autopipe: error: <message>``
  (one line) to stderr; argparse usage errors exit 2 as well;
- 130 interrupted (Ctrl-C);
- anything else is a bug in autopipe and propagates with its traceback.

Usage::

    autopipe profile models/gpt.py -k n_layer=4 --batch-size 8 -o profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console

from autopipe import __version__
from autopipe.errors import AutopipeError, RuntimeFailure

from .args import (
    UsageError,
    default_micro_batch_sizes,
    int_list,
    non_negative_int,
    output_path,
    positive_int,
    resolve_device,
    split_names,
)
from .render import ProgressCallback, print_profile, profile_summary, progress_reporter

if TYPE_CHECKING:
    from autopipe.costs.profile import Profile
    from autopipe.model.load import LoadedModel

__all__ = ["build_parser", "main"]

EXIT_FAILED_RUN = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="model file, path/to/model.py[:factory]")
    p.add_argument(
        "-k", dest="kwargs", metavar="KEY=VALUE", action="append", default=[],
        help="keyword argument for the factory (repeatable), e.g. -k n_layer=4; values are Python literals",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autopipe",
        description="Plan pipeline parallelism for a PyTorch model: profile it, pick stage cuts, "
        "micro-batches, schedule and recomputation.",
    )
    parser.add_argument("--version", action="version", version=f"autopipe {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = commands.add_parser(
        "profile", help="measure what every block of a model costs; write a profile JSON",
        description="Trace MODEL into blocks and measure each block's forward/backward time and memory.",
    )  # fmt: skip
    _add_model_arguments(p)
    p.add_argument("-o", "--output", default="profile.json", help="profile file to write (default: profile.json)")
    p.add_argument("--batch-size", default="8", metavar="N", help="global batch size (default: 8)")
    _add_profiling_arguments(p)
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of the table")
    p.set_defaults(func=cmd_profile)
    from .plan_cmd import add_plan_parsers

    add_plan_parsers(commands, _add_model_arguments, _add_profiling_arguments)
    from .emit_cmd import add_emit_parsers

    add_emit_parsers(commands)
    from .run_cmd import add_run_parser

    add_run_parser(commands)
    from .analytic_cmd import add_calibrate_parser

    add_calibrate_parser(commands)
    return parser


def _add_profiling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--micro-batch-sizes", default=None, metavar="U,U,...",
        help="micro-batch sizes to measure, e.g. 1,2,4 (default: batch/4, batch/2, batch)",
    )  # fmt: skip
    p.add_argument("--tracer", choices=("auto", "fx", "export"), default="auto", help="graph tracer (default: auto)")
    p.add_argument(
        "--leaf", action="append", default=None, metavar="CLASS",
        help="module class to keep whole inside one block (repeatable or comma-separated)",
    )  # fmt: skip
    p.add_argument("--blocks", default=None, metavar="N", help="target number of blocks (default: about one per layer)")
    p.add_argument("--warmup", default="2", metavar="N", help="untimed runs before measuring (default: 2)")
    p.add_argument("--repeat", default="5", metavar="N", help="timed runs per measurement (default: 5)")
    p.add_argument(
        "--device", default=None,
        help="cpu, cuda or cuda:N to measure on (default: cuda if available); for plan, a catalogue device "
        "(h100, h200, a100-80gb, a100-40gb, or your --device-file's) to plan analytically on the meta device",
    )  # fmt: skip
    p.add_argument(
        "--threads", default="1", metavar="N",
        help="CPU threads while measuring (default: 1, as each rank of 'autopipe run' uses)",
    )  # fmt: skip


# ----------------------------------------------------------------------------- profile


def _check_profile_args(args: argparse.Namespace) -> None:
    """Validate and normalise the profile options in place (fast, before loading the model)."""
    args.batch_size = positive_int(str(args.batch_size), "--batch-size")
    if args.micro_batch_sizes is None:
        args.micro_batch_sizes = default_micro_batch_sizes(args.batch_size)
    else:
        args.micro_batch_sizes = int_list(args.micro_batch_sizes, "--micro-batch-sizes")
        too_big = [u for u in args.micro_batch_sizes if u > args.batch_size]
        if too_big:
            raise UsageError(
                f"--micro-batch-sizes {','.join(map(str, too_big))} larger than --batch-size {args.batch_size}; "
                f"use sizes up to {args.batch_size} or raise --batch-size"
            )
    args.blocks = positive_int(args.blocks, "--blocks") if args.blocks is not None else None
    args.warmup = non_negative_int(args.warmup, "--warmup")
    args.repeat = positive_int(args.repeat, "--repeat")
    args.threads = positive_int(str(args.threads), "--threads")
    args.leaf = split_names(args.leaf)
    args.output = str(output_path(args.output, "--output"))
    args.device = resolve_device(args.device)


def _run_profile(args: argparse.Namespace, loaded: LoadedModel, progress: ProgressCallback | None = None) -> Profile:
    """The one call into the profiler (kept apart so tests can replace it)."""
    from autopipe.costs.measured import profile_model  # type: ignore[import-not-found,unused-ignore]
    from autopipe.graph.recipe import TraceRecipe

    profile: Profile = profile_model(
        loaded,
        micro_batch_sizes=args.micro_batch_sizes,
        recipe=TraceRecipe(tracer=args.tracer, leaf_modules=args.leaf, max_blocks=args.blocks),
        warmup=args.warmup,
        repeat=args.repeat,
        device=args.device,
        progress=progress,
        threads=args.threads,
    )
    return profile


def cmd_profile(args: argparse.Namespace, out: Console, err: Console) -> int:
    _check_profile_args(args)
    from autopipe.model.load import check_model_runs, load_model, parse_kwargs

    loaded = load_model(args.model, parse_kwargs(args.kwargs), device=args.device)
    check_model_runs(loaded, max(args.micro_batch_sizes))
    with progress_reporter(err) as progress:
        profile = _run_profile(args, loaded, progress)
    profile.save(args.output)
    if args.json:
        print(json.dumps(profile_summary(profile, args.output), indent=1), file=out.file)
    else:
        print_profile(profile, out, args.output)
    return 0


def profile_for_plan(args: argparse.Namespace, err: Console) -> Profile:
    """Profile MODEL for ``autopipe plan`` with the profiling options it shares with ``profile``."""
    saved_output = args.output
    _check_profile_args(args)
    args.output = saved_output
    from autopipe.model.load import check_model_runs, load_model, parse_kwargs

    loaded = load_model(args.model, parse_kwargs(args.kwargs), device=args.device)
    check_model_runs(loaded, max(args.micro_batch_sizes))
    with progress_reporter(err) as progress:
        return _run_profile(args, loaded, progress)


# ----------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``autopipe`` command line; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors (argparse exits 2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    # Tables stay readable when piped (rich assumes 80 columns without a terminal).
    out = Console(file=sys.stdout, highlight=False, width=None if sys.stdout.isatty() else 120)
    err = Console(file=sys.stderr, highlight=False)
    try:
        code: int = args.func(args, out, err)
        return code
    except RuntimeFailure as e:
        print(f"autopipe: error: {e}", file=sys.stderr)
        return EXIT_FAILED_RUN
    except AutopipeError as e:
        print(f"autopipe: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("autopipe: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
