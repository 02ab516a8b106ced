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
    add_load_timeout_argument,
    add_model_arguments,
    add_profiling_arguments,
    profiling_options,
)
from .progress import ProgressCallback, progress_bar
from .render import print_profile, profile_summary

if TYPE_CHECKING:
    from autopipe.api import Profile

__all__ = ["add_profile_parser", "measure"]


def add_profile_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "profile",
        help="measure what every block of a model costs; write a profile JSON",
        description="Trace MODEL into blocks and measure each block's forward/backward time and memory.",
    )
    add_model_arguments(p)
    p.add_argument("-o", "--output", default="profile.json", help="profile file to write (default: profile.json)")
    p.add_argument("--batch-size", default="8", metavar="N", help="global batch size (default: 8)")
    add_profiling_arguments(p)
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of the table")
    add_load_timeout_argument(p)
    p.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.api import default_micro_batch_sizes

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


def measure(
    model: str, kwargs: list[str], options: ProfilingOptions, progress: ProgressCallback | None = None
) -> Profile:
    """Load MODEL (``-k`` ``kwargs``), check it runs, and measure it (``autopipe.profile``), telling ``progress``."""
    from autopipe import api

    profile: Profile = api.profile(
        model,
        kwargs=api.parse_kwargs(kwargs),
        micro_batch_sizes=options.micro_batch_sizes,
        tracer=options.tracer,
        leaf_modules=options.leaf_modules,
        max_blocks=options.max_blocks,
        device=options.device,
        warmup=options.warmup,
        repeat=options.repeat,
        threads=options.threads,
        progress=progress,
    )
    return profile
