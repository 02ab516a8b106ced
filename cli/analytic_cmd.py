"""Analytic planning on the command line: ``plan --device h100 --gpus 64`` and ``calibrate``.

``autopipe plan MODEL --device NAME`` with a catalogue device (``h100``, ``a100-80gb``, ...;
``--analytic`` for this CPU) builds MODEL on the meta device and prices it with the analytic
cost model (no weights allocated); ``--gpus G`` searches tensor-parallel degree x pipeline depth x
data-parallel width (``--tensor-parallel``, ``--stages``, ``--data-parallel`` pin them; ``--cluster``
describes the nodes and links).
``autopipe calibrate PROFILE --model MODEL`` fits the analytic model's efficiencies to a measured
profile (MODEL, imported, is the model file the profile was made from: a profile is only data).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console

from .args import int_list, output_path, positive_int, split_names
from .progress import ProgressCallback

if TYPE_CHECKING:
    from autopipe.api import DeviceSpec, ModelCounts

__all__ = [
    "AnalyticOptions",
    "add_analytic_arguments",
    "add_calibrate_parser",
    "analytic_counts_for_plan",
    "analytic_options",
    "device_for",
    "wants_analytic",
]

MEASURING_DEVICES = ("cpu", "cuda")


def add_analytic_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpus",
        default=None,
        metavar="G",
        help="devices in all: also choose pipeline depth S x data-parallel width G/S",
    )
    p.add_argument(
        "--analytic",
        action="store_true",
        help="count FLOPs and bytes on the meta device instead of measuring (implied by a catalogue --device)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=("fp32", "tf32", "bf16", "fp16", "fp8"),
        help="training precision, analytic mode (default: bf16 on a catalogue GPU, else fp32); fp8: linear "
        "layers at the device's FP8 peak as Transformer Engine runs them, the rest bf16",
    )
    p.add_argument(
        "--device-file",
        action="append",
        default=[],
        metavar="FILE",
        help="your own device catalogue entries (JSON like autopipe/costs/devices.json; repeatable)",
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="efficiencies fitted by 'autopipe calibrate' (default: the stored one for the device, if any)",
    )
    _add_sharding_arguments(p)
    p.add_argument(
        "--tensor-parallel",
        default=None,
        metavar="T",
        help="with --gpus: pin the tensor-parallel degree (Megatron-style, within a node; default: searched)",
    )
    p.add_argument(
        "--data-parallel",
        default=None,
        metavar="D",
        help="with --gpus: pin the data-parallel width (default: searched)",
    )
    p.add_argument(
        "--context-parallel",
        default=None,
        metavar="CP",
        help="with --gpus: pin the context-parallel degree (the sequence split over CP devices; default: "
        "searched for sequences of 8192 tokens and more)",
    )
    p.add_argument(
        "--expert-parallel",
        default=None,
        metavar="EP",
        help="with --gpus: pin the expert-parallel degree (each MoE layer's routed experts over EP devices; "
        "it divides the experts; default: searched)",
    )
    p.add_argument(
        "--expert-tensor-parallel",
        default=None,
        metavar="ETP",
        help="with --gpus: pin the expert tensor-parallel degree (default: 1)",
    )
    p.add_argument(
        "--no-sequence-parallel",
        action="store_true",
        help="with --gpus: tensor parallelism without Megatron's sequence parallelism",
    )
    p.add_argument(
        "--cluster",
        default=None,
        metavar="FILE",
        help="with --gpus: JSON with devices_per_node, nvlink_bandwidth, network_bandwidth, nvlink_latency_s, "
        "network_latency_s (default: the device's)",
    )


def _add_sharding_arguments(p: argparse.ArgumentParser) -> None:
    """The data-parallel state's sharding and what overlaps (with --gpus)."""
    p.add_argument(
        "--zero1",
        action="store_true",
        help="with --gpus: pin ZeRO-1, the optimizer state and master weights split over the data-parallel "
        "replicas (--sharding zero1)",
    )
    p.add_argument(
        "--sharding",
        default=None,
        metavar="NAME",
        help="with --gpus: pin how the state is split over the data-parallel replicas: none, zero1, zero2 "
        "(and gradients), zero3 (and weights, gathered per micro-batch) or zero3-step (gathered once a step); "
        "default: searched",
    )
    p.add_argument(
        "--shard-group",
        default=None,
        metavar="N",
        help="with --gpus and --sharding: split it over N replicas, replicated across the rest (hybrid, HSDP); "
        "default: all replicas, or a node's, searched",
    )
    p.add_argument(
        "--overlap",
        default=None,
        metavar="SPEC",
        help="with --gpus: what runs beside the computation: none, or any of grad_reduce, param_gather, p2p, "
        "tp_comm=SHARE (default: what the --target runs; autopipe: p2p)",
    )


def wants_analytic(device: str | None, analytic: bool) -> bool:
    """True for --analytic or a --device that is not one to measure on (cpu, cuda, cuda:N)."""
    name = (device or "").strip().lower()
    return analytic or (bool(name) and name.partition(":")[0] not in MEASURING_DEVICES)


def device_for(device: str | None, device_files: Sequence[str], calibration: str | None) -> DeviceSpec:
    """The catalogue device ``--device`` names (this CPU for --analytic), with its calibration."""
    from autopipe.api import catalogue_device

    return catalogue_device((device or "cpu").partition(":")[0], device_files, calibration)


@dataclass(frozen=True)
class AnalyticOptions:
    """What an analytic plan counts: ``--micro-batch-sizes``, ``--dtype``, ``--tracer``, ``--leaf``, ``--blocks``."""

    micro_batch_sizes: tuple[int, ...] | None  # None: ANALYTIC_MICRO_BATCH_SIZES
    dtype: str | None  # None: the device's default (defaults.default_dtype)
    tracer: str  # a Tracer's text: auto, fx or export
    leaf_modules: tuple[str, ...]
    max_blocks: int | None


def analytic_options(args: argparse.Namespace) -> AnalyticOptions:
    return AnalyticOptions(
        micro_batch_sizes=int_list(args.micro_batch_sizes, "--micro-batch-sizes") if args.micro_batch_sizes else None,
        dtype=args.dtype,
        tracer=args.tracer,
        leaf_modules=split_names(args.leaf),
        max_blocks=positive_int(args.blocks, "--blocks") if args.blocks is not None else None,
    )


def analytic_counts_for_plan(
    model: str, kwargs: list[str], spec: DeviceSpec, options: AnalyticOptions, progress: ProgressCallback | None = None
) -> ModelCounts:
    """MODEL (``-k`` ``kwargs``) built on meta and counted (not yet priced), telling ``progress``."""
    from autopipe.api import Tracer, TraceRecipe, count, parse_kwargs

    recipe = TraceRecipe(
        tracer=Tracer(options.tracer), leaf_modules=options.leaf_modules, max_blocks=options.max_blocks
    )
    return count(
        model,
        parse_kwargs(kwargs),
        spec,
        micro_batch_sizes=options.micro_batch_sizes,
        dtype=options.dtype,
        recipe=recipe,
        progress=progress,
    )


def add_calibrate_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = commands.add_parser(
        "calibrate",
        help="fit the analytic cost model's efficiencies to a measured profile",
        description="Count MODEL (the model file PROFILE was made from, built with the profile's kwargs) on "
        "the meta device and fit compute efficiency, memory efficiency and per-op overhead of the device "
        "PROFILE was measured on; store them for analytic plans. MODEL is imported (it is code); PROFILE is "
        "only read, so the model file it names is never imported on its word.",
    )
    c.add_argument("profile", metavar="PROFILE", help="profile JSON written by autopipe profile (measured)")
    c.add_argument(
        "--model",
        default=None,
        metavar="MODEL",
        help="the model file PROFILE was made from, path/to/model.py[:factory] (required: it is imported)",
    )
    c.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE",
        help="calibration file to write (default: the calibration store)",
    )
    c.add_argument(
        "--device-file", action="append", default=[], metavar="FILE", help="your own device catalogue entries"
    )
    c.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.api import Profile, calibrate, save_calibration
    from autopipe.errors import ProfileError

    target = output_path(args.output, "--output") if args.output else None
    profile = Profile.load(args.profile)
    if args.model is None:
        raise ProfileError(
            "calibrate needs --model MODEL, the model file the profile was made from: counting its ops imports "
            f"it, and a profile is data, so the file it names ({profile.recipe.model_file!r}) is not imported"
        )
    cal = calibrate(profile, model=args.model, device_files=args.device_file)
    path = save_calibration(cal, target)
    s = cal.spec
    curves = "".join(f", {d} GEMMs {e:.3f} * s / (s + {h:g})" for d, e, h in s.compute_curve)
    out.print(
        f"{s.name}: compute efficiency {s.compute_efficiency:.3f}{curves}, "
        f"memory efficiency {s.memory_efficiency:.3f}, "
        f"op overhead {s.op_overhead_s * 1e6:.2f} us; {cal.observations} block times, median error "
        f"{cal.median_error:.1%}, worst {cal.max_error:.1%}; wrote {path}"
    )
    return 0
