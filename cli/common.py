"""Parser pieces more than one command shares: MODEL with ``-k``, and the profiling flags.

The flags are read into a :class:`ProfilingOptions` value once, checked, before any slow work
starts; the commands pass that value on and never change their argparse Namespace.

Tests: tests/cli/test_main.py.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from autopipe.modes import Tracer

from .args import UsageError, int_list, non_negative_int, positive_int, resolve_device, split_names

__all__ = [
    "LOAD_TIMEOUT_HELP",
    "MEASURE_DEVICE_HELP",
    "ProfilingOptions",
    "add_load_timeout_argument",
    "add_model_arguments",
    "add_profiling_arguments",
    "load_timeout_seconds",
    "profiling_options",
]


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="model file, path/to/model.py[:factory]")
    p.add_argument(
        "-k",
        dest="kwargs",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="keyword argument for the factory (repeatable), e.g. -k n_layer=4; values are Python literals",
    )


LOAD_TIMEOUT_HELP = (
    "seconds each call into the model file (its import, the factory, example_inputs, train_data and "
    "each of its batches, one check forward) may take before it is stopped with one line (default: 300; 0: no limit)"
)


def add_load_timeout_argument(p: argparse.ArgumentParser) -> None:
    """``--load-timeout SECONDS``, on every command that imports a model file (read by :func:`main`)."""
    p.add_argument("--load-timeout", default=None, metavar="SECONDS", help=LOAD_TIMEOUT_HELP)


def load_timeout_seconds(args: argparse.Namespace) -> float | None:
    """``--load-timeout`` as a number of seconds (0: no limit); None when not given (the default)."""
    text = getattr(args, "load_timeout", None)
    if text is None:
        return None
    try:
        value = float(text) if len(text) <= 100 else float("too long")
    except ValueError:
        raise UsageError(
            f"--load-timeout must be a number of seconds, like 300 (0: no limit) (got {text[:100]!r})"
        ) from None
    return value


MEASURE_DEVICE_HELP = "cpu, cuda or cuda:N to measure on (default: cuda if available)"


def add_profiling_arguments(p: argparse.ArgumentParser, device_help: str = MEASURE_DEVICE_HELP) -> None:
    """The profiling flags; ``device_help`` describes ``--device`` for this command."""
    p.add_argument(
        "--micro-batch-sizes",
        default=None,
        metavar="U,U,...",
        help="micro-batch sizes to measure, e.g. 1,2,4 (default: batch/4, batch/2, batch)",
    )
    p.add_argument("--tracer", choices=("auto", "fx", "export"), default="auto", help="graph tracer (default: auto)")
    p.add_argument(
        "--leaf",
        action="append",
        default=None,
        metavar="CLASS",
        help="module class to keep whole inside one block (repeatable or comma-separated)",
    )
    p.add_argument("--blocks", default=None, metavar="N", help="target number of blocks (default: about one per layer)")
    p.add_argument("--warmup", default="2", metavar="N", help="untimed runs before measuring (default: 2)")
    p.add_argument("--repeat", default="5", metavar="N", help="timed runs per measurement (default: 5)")
    p.add_argument("--device", default=None, help=device_help)
    p.add_argument(
        "--threads",
        default="1",
        metavar="N",
        help="CPU threads while measuring (default: 1, as each rank of 'autopipe run' uses)",
    )


@dataclass(frozen=True)
class ProfilingOptions:
    """The profiling flags, checked: what the measured profiler is called with."""

    micro_batch_sizes: tuple[int, ...]  # ascending, each at most the batch size
    tracer: Tracer
    leaf_modules: tuple[str, ...]  # --leaf, split at commas
    max_blocks: int | None  # --blocks
    warmup: int
    repeat: int
    device: str  # cpu, cuda or cuda:N (resolved: cuda when available)
    threads: int


def profiling_options(args: argparse.Namespace, batch_size: int, default_sizes: tuple[int, ...]) -> ProfilingOptions:
    """Check the profiling flags of ``args`` (``default_sizes`` without --micro-batch-sizes)."""
    if args.micro_batch_sizes is None:
        sizes = default_sizes
    else:
        sizes = int_list(args.micro_batch_sizes, "--micro-batch-sizes")
        too_big = [u for u in sizes if u > batch_size]
        if too_big:
            raise UsageError(
                f"--micro-batch-sizes {','.join(map(str, too_big))} larger than --batch-size {batch_size}; "
                f"use sizes up to {batch_size} or raise --batch-size"
            )
    return ProfilingOptions(
        micro_batch_sizes=sizes,
        tracer=Tracer(args.tracer),
        leaf_modules=split_names(args.leaf),
        max_blocks=positive_int(args.blocks, "--blocks") if args.blocks is not None else None,
        warmup=non_negative_int(args.warmup, "--warmup"),
        repeat=positive_int(args.repeat, "--repeat"),
        threads=positive_int(str(args.threads), "--threads"),
        device=resolve_device(args.device),
    )
