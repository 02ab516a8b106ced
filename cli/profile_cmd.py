"""``autopipe profile``, and the measured profile ``autopipe plan`` makes of a model itself.

Tests: tests/cli/test_main.py.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from rich.console import Console

from .args import output_path, positive_int
from .common import (
    ProfilingOptions,
    add_model_arguments,
    add_profiling_arguments,
    profiling_options,
)
from .progress import ProgressCallback, progress_bar
from .render import print_profile, profile_summary

if TYPE_CHECKING:
    from autopipe.costs.profile import Profile
    from autopipe.model.load import LoadedModel

__all__ = ["add_profile_parser", "measure"]


def add_profile_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "profile", help="measure what every block of a model costs; write a profile JSON",
        description="Trace MODEL into blocks and measure each block's forward/backward time and memory.",
    )  # fmt: skip
    add_model_arguments(p)
    p.add_argument("-o", "--output", default="profile.json", help="profile file to write (default: profile.json)")
    p.add_argument("--batch-size", default="8", metavar="N", help="global batch size (default: 8)")
    add_profiling_arguments(p)
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of the table")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.planner.defaults import default_micro_batch_sizes

    batch = positive_int(str(args.batch_size), "--batch-size")
    options = profiling_options(args, batch, default_micro_batch_sizes(batch))
    output = str(output_path(args.output, "--output"))
    with progress_bar(err, quiet=args.json) as progress:
        profile = measure(args.model, args.kwargs, options, progress)
    profile.save(output)
    if args.json:
        print(json.dumps(profile_summary(profile, output), indent=1), file=out.file)
    else:
        print_profile(profile, out, output)
    return 0


def measure(model: str, kwargs: list[str], options: ProfilingOptions, progress: ProgressCallback | None = None) -> Profile:
    """Load MODEL (``-k`` ``kwargs``), check it runs, and measure it, telling ``progress``."""
    if progress is not None:
        progress(f"loading {model}", 0, 0)
    from autopipe.model.load import check_model_runs, load_model, parse_kwargs

    loaded = load_model(model, parse_kwargs(kwargs), device=options.device)
    if progress is not None:
        progress(f"checking that {model} runs", 0, 0)
    check_model_runs(loaded, max(options.micro_batch_sizes))
    return _run_profile(options, loaded, progress)


def _run_profile(options: ProfilingOptions, loaded: LoadedModel, progress: ProgressCallback | None = None) -> Profile:
    """The one call into the profiler (kept apart so tests can replace it)."""
    from autopipe.costs.measured import profile_model  # type: ignore[import-not-found,unused-ignore]
    from autopipe.graph.recipe import TraceRecipe

    recipe = TraceRecipe(tracer=options.tracer, leaf_modules=options.leaf_modules, max_blocks=options.max_blocks)
    profile: Profile = profile_model(
        loaded,
        micro_batch_sizes=options.micro_batch_sizes,
        recipe=recipe,
        warmup=options.warmup,
        repeat=options.repeat,
        device=options.device,
        progress=progress,
        threads=options.threads,
    )
    return profile
