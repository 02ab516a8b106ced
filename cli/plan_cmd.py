"""``autopipe plan`` and ``autopipe show``: parse, call :mod:`autopipe.api`, print.

The flags are parsed into typed values here (the user's :class:`~autopipe.api.Choices` and
:class:`~autopipe.api.Link`, as ``autopipe.plan`` takes them); what they leave out (devices,
memory limit, link, cost per action, bytes per parameter) is decided by the library, the same
code ``autopipe.plan`` runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console

from autopipe.errors import OutputError, PlanError
from autopipe.schedules import schedule_names
from autopipe.units import format_bytes, parse_bytes, parse_duration, parse_rate

from .analytic_cmd import (
    add_analytic_arguments,
    analytic_counts_for_plan,
    analytic_options,
    device_for,
    wants_analytic,
)
from .args import UsageError, balance_list, cli_words, kinds_list, non_negative_int, output_path, positive_int
from .common import MEASURE_DEVICE_HELP, add_load_timeout_argument, add_profiling_arguments, profiling_options
from .profile_cmd import measure
from .progress import ProgressCallback, progress_bar
from .render_plan import plan_json, print_plan

if TYPE_CHECKING:
    from autopipe.api import Choices, DeviceSpec, Link, ModelCounts, ParallelPlan, Profile, Rejected
    from autopipe.plans import Plan

__all__ = ["PlanFlags", "add_plan_parsers", "plan_flags"]

DEFAULT_BATCH = 32
_T = TypeVar("_T")


def add_plan_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "plan",
        help="choose stage cuts, micro-batches, schedule and recomputation; write plan.json",
        description="Plan pipeline parallelism for MODEL (profiling it first) or for a saved --profile.",
    )
    p.add_argument(
        "model", metavar="MODEL", nargs="?", help="model file, path/to/model.py[:factory] (optional with --profile)"
    )
    p.add_argument(
        "-k",
        dest="kwargs",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="factory keyword argument (repeatable)",
    )
    p.add_argument("--profile", default=None, help="plan from this profile JSON instead of profiling MODEL")
    p.add_argument(
        "--stages",
        default=None,
        help="pipeline devices (default: the visible GPUs, else 4); with --gpus, the pipeline depth",
    )
    p.add_argument("--devices", default=None, help="the same as --stages, for one pipeline (without --gpus)")
    p.add_argument(
        "--memory", default=None, help="memory per device, like 16GiB or 80GB (default: the device's memory)"
    )
    p.add_argument("--batch-size", default=str(DEFAULT_BATCH), help=f"samples per iteration (default: {DEFAULT_BATCH})")
    p.add_argument("--micro-batches", default=None, help="pin the micro-batch count")
    p.add_argument("--schedule", default=None, choices=schedule_names(), help="pin the schedule")
    p.add_argument("--virtual", default=None, help="pin the virtual stages per device (interleaved-1f1b)")
    p.add_argument(
        "--target",
        default="autopipe",
        metavar="{autopipe,megatron,torchtitan,torch}",
        help="the framework that will run the plan: search only the schedules and recomputation it runs "
        "(megatron: 1f1b and interleaved-1f1b, every stage recomputed or none; torchtitan: torch's schedule "
        "classes, every stage or none; torch: to_torch_pipelining's; default autopipe: everything), with --balance "
        "and --gpus too; the free plan's prediction is shown and kept beside it",
    )
    p.add_argument(
        "--balance",
        default=None,
        metavar="N,N,...",
        help="price your own split: blocks per chunk in chunk order (S entries; "
        "S x v with --schedule for interleaved/V "
        "schedules); the plan is your split, autopipe's best is shown beside it",
    )
    p.add_argument("--no-recompute", action="store_true", help="never recompute activations")
    p.add_argument("--recompute-all", action="store_true", help="recompute activations on every stage")
    _memory_flags(p)
    _link_flags(p)
    p.add_argument("-o", "--output", default="plan.json", help="plan file to write (default: plan.json)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--timeline", default=None, metavar="FILE", help="draw the schedule as a Gantt chart (.png or .svg)")
    add_profiling_arguments(
        p,
        MEASURE_DEVICE_HELP + "; or a catalogue device (h100, h800, h200, a100-80gb, a100-40gb, or your "
        "--device-file's) to plan analytically on the meta device",
    )
    add_analytic_arguments(p)
    add_load_timeout_argument(p)
    p.set_defaults(func=cmd_plan)

    s = commands.add_parser(
        "show",
        help="print a saved plan again, with a text timeline",
        description="Print PLAN's stages, schedule and baselines again, with a text timeline of one "
        "iteration (or one JSON object with --json); --timeline also draws it to a .png or .svg.",
    )
    s.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    s.add_argument("--timeline", default=None, metavar="FILE", help="draw the schedule as a Gantt chart (.png or .svg)")
    s.set_defaults(func=cmd_show)


@dataclass(frozen=True)
class PlanFlags:
    """``autopipe plan``'s own flags, checked; ``None`` leaves the choice to the library's
    defaults or to the search."""

    batch_size: int
    devices: int | None  # --devices/--stages: pipeline devices; with gpus, the pipeline depth
    memory_limit: float | None  # bytes per device
    choices: Choices  # --micro-batches, --schedule, --virtual, --no-recompute / --recompute-all
    link: Link  # --bandwidth, --latency, --action-overhead, --send-overhead
    gpus: int | None
    output: str
    timeline: str | None
    tensor_parallel: int | None = None  # pin t (with gpus)
    data_parallel: int | None = None  # pin D (with gpus)
    cluster: tuple[tuple[str, float], ...] = ()  # --cluster FILE: Cluster field -> value
    balance: tuple[int, ...] | None = None  # blocks per chunk, in chunk order (--balance)
    context_parallel: int | None = None  # pin cp (with gpus)
    expert_parallel: int | None = None  # pin ep (with gpus)
    expert_tensor_parallel: int | None = None  # pin etp (with gpus)


def _optional(text: str | None, parse: Callable[[str, str], _T], flag: str) -> _T | None:
    return parse(text, flag) if text is not None else None


def _link_flags(p: argparse.ArgumentParser) -> None:
    """--bandwidth, --latency, --action-overhead, --send-overhead: what the link and the executor cost."""
    p.add_argument("--bandwidth", default=None, help="link bandwidth, like 25GB/s (default: by device type)")
    p.add_argument("--latency", default=None, help="link latency, like 20us (default: by device type)")
    p.add_argument(
        "--action-overhead",
        default=None,
        help="the executor's own time per F, B or W action, like 0.2ms "
        "(default: the profile's measured, else by device type)",
    )
    p.add_argument(
        "--send-overhead",
        default=None,
        help="the executor's time per action that sends to another rank, on top of --action-overhead, like 0.4ms "
        "(default: the profile's measured, else by device type)",
    )


def _memory_flags(p: argparse.ArgumentParser) -> None:
    """The uniform memory choice's pins (``Choices.recompute_modules``, ``recompute_layers``, ``offload_modules``)."""
    p.add_argument(
        "--recompute-modules",
        default=None,
        metavar="KINDS",
        help="recompute these module kinds in every layer (selective recomputation: core_attn, layernorm, "
        "mla_up_proj, mlp, mlp_act, comma-separated), or none; default: searched",
    )
    p.add_argument(
        "--recompute-layers",
        default=None,
        metavar="K",
        help="recompute the first K layers of each stage whole (Megatron's block method), 0 for none; "
        "default: searched",
    )
    p.add_argument(
        "--offload-modules",
        default=None,
        metavar="KINDS",
        help="offload these module kinds' saved inputs to the host in every layer (attn_norm, qkv_linear, "
        "core_attn, attn_proj, mlp_norm), or none; default: searched where the device has a host link",
    )


def plan_flags(args: argparse.Namespace) -> PlanFlags:
    """Parse and check the flags of ``autopipe plan`` (fast: before any profiling)."""
    from autopipe.api import SHARDINGS, TARGETS, Choices, Link, Overlap, Recompute, read_cluster_file

    batch = positive_int(args.batch_size, "--batch-size")
    devices = _devices(args)
    memory = _optional(args.memory, parse_bytes, "--memory")
    if args.no_recompute and args.recompute_all:
        raise UsageError("--no-recompute and --recompute-all contradict each other; give one")
    output = str(output_path(args.output, "--output"))
    timeline = _timeline_path(args.timeline)
    if args.profile is None and args.model is None:
        raise UsageError("give a MODEL to profile or --profile profile.json")
    _check_unused_measuring_flags(args)
    if args.dtype is not None and not wants_analytic(args.device, args.analytic):
        raise UsageError(f"--dtype {args.dtype} applies to analytic plans; add --device NAME (e.g. h100) or --analytic")
    gpus = _optional(args.gpus, positive_int, "--gpus")
    if args.zero1 and gpus is None:
        raise UsageError("--zero1 shards optimizer state across data-parallel replicas; give --gpus G as well")
    sharding_flags = (("--sharding", args.sharding), ("--shard-group", args.shard_group), ("--overlap", args.overlap))
    for flag, given in sharding_flags:
        if given is not None and gpus is None:
            raise UsageError(f"{flag} applies to the data-parallel replicas of --gpus G; give --gpus as well")
    if args.sharding is not None and args.sharding not in SHARDINGS:
        raise UsageError(f"--sharding {args.sharding}: use one of {', '.join(SHARDINGS)}")
    if args.zero1 and args.sharding not in (None, "zero1"):
        raise UsageError(f"--zero1 and --sharding {args.sharding} contradict each other; give one")
    shard_group = _optional(args.shard_group, positive_int, "--shard-group")
    if shard_group is not None and args.sharding in (None, "none") and not args.zero1:
        raise UsageError("--shard-group splits a sharding over fewer replicas; give --sharding NAME too")
    if args.overlap is not None:
        try:
            Overlap.parse(args.overlap, "--overlap")
        except PlanError as e:
            raise UsageError(str(e)) from None
    if args.target not in TARGETS:
        raise UsageError(f"--target {args.target}: use one of {', '.join(TARGETS)}")
    recompute = Recompute.NEVER if args.no_recompute else Recompute.ALWAYS if args.recompute_all else Recompute.AUTO
    choices = Choices(
        _optional(args.micro_batches, positive_int, "--micro-batches"),
        args.schedule,
        _optional(args.virtual, positive_int, "--virtual"),
        recompute,
        args.target,
        _optional(args.recompute_modules, kinds_list, "--recompute-modules"),
        _optional(args.recompute_layers, non_negative_int, "--recompute-layers"),
        _optional(args.offload_modules, kinds_list, "--offload-modules"),
    )
    link = Link(
        _optional(args.bandwidth, parse_rate, "--bandwidth"),
        _optional(args.latency, parse_duration, "--latency"),
        _optional(args.action_overhead, parse_duration, "--action-overhead"),
        _optional(args.send_overhead, parse_duration, "--send-overhead"),
    )
    balance = _optional(args.balance, balance_list, "--balance")
    if balance is not None and gpus is not None:
        raise UsageError("--balance prices one pipeline's split and --gpus searches data x pipeline layouts; give one")
    tensor, data, cp, ep, etp = _cluster_degrees(args, gpus, devices)
    cluster = tuple(read_cluster_file(args.cluster).items()) if args.cluster is not None else ()
    return PlanFlags(
        batch, devices, memory, choices, link, gpus, output, timeline, tensor, data, cluster, balance, cp, ep, etp
    )


def _cluster_degrees(
    args: argparse.Namespace, gpus: int | None, devices: int | None
) -> tuple[int | None, int | None, int | None, int | None, int | None]:
    """--tensor-parallel, --data-parallel, --context-parallel, --expert-parallel and
    --expert-tensor-parallel, checked: each only with --gpus, the degrees dividing it."""
    from autopipe.api import check_degrees

    tensor = _optional(args.tensor_parallel, positive_int, "--tensor-parallel")
    data = _optional(args.data_parallel, positive_int, "--data-parallel")
    cp = _optional(args.context_parallel, positive_int, "--context-parallel")
    ep = _optional(args.expert_parallel, positive_int, "--expert-parallel")
    etp = _optional(args.expert_tensor_parallel, positive_int, "--expert-tensor-parallel")
    for flag, given in (
        ("--tensor-parallel", tensor),
        ("--data-parallel", data),
        ("--context-parallel", cp),
        ("--expert-parallel", ep),
        ("--expert-tensor-parallel", etp),
        ("--cluster", args.cluster),
        ("--no-sequence-parallel", args.no_sequence_parallel or None),
    ):
        if given is not None and gpus is None:
            raise UsageError(f"{flag} applies to the devices of --gpus G; give --gpus as well")
    if gpus is not None:
        if args.devices is not None:
            raise UsageError(
                "--devices counts one pipeline's devices; with --gpus G pin the pipeline depth with --stages"
            )
        pinned = [("--tensor-parallel", tensor), ("--stages", devices), ("--data-parallel", data)]
        check_degrees(gpus, [*pinned, ("--context-parallel", cp)], "--gpus")
    return tensor, data, cp, ep, etp


def _devices(args: argparse.Namespace) -> int | None:
    """``--devices`` or ``--stages`` (the same thing; both given, they must agree)."""
    stages = _optional(args.stages, positive_int, "--stages")
    devices = _optional(args.devices, positive_int, "--devices")
    if stages is not None and devices is not None and stages != devices:
        raise UsageError(f"--devices {devices} and --stages {stages} are the same thing (pipeline devices); give one")
    return stages if stages is not None else devices


def _timeline_path(text: str | None) -> str | None:
    if text is None:
        return None
    path = output_path(text, "--timeline")
    if path.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--timeline {text}: use a .png or .svg file name")
    return str(path)


def cmd_plan(args: argparse.Namespace, out: Console, err: Console) -> int:
    flags = plan_flags(args)
    with progress_bar(err, quiet=args.json) as progress:
        plan, note = _make_plan(args, flags, progress)
    plan.save(flags.output)
    _show(plan, out, args.json, flags.timeline, wrote=f"wrote {flags.output}")
    if note and not args.json:
        out.print(note)
    return 0


def _make_plan(args: argparse.Namespace, flags: PlanFlags, progress: ProgressCallback | None) -> tuple[Plan, str]:
    """The plan ``args`` ask for (profiling or counting MODEL first), with the --gpus note."""
    if progress is not None:
        progress("starting", 0, 0)
    from autopipe import api

    profile, spec, counts = _profile_for_plan(args, flags, progress)
    if flags.gpus is not None:
        result = api.search_cluster(
            profile,
            gpus=flags.gpus,
            batch_size=flags.batch_size,
            memory=flags.memory_limit,
            tensor_parallel=flags.tensor_parallel,
            stages=flags.devices,
            data_parallel=flags.data_parallel,
            context_parallel=flags.context_parallel,
            expert_parallel=flags.expert_parallel,
            expert_tensor_parallel=flags.expert_tensor_parallel,
            choices=flags.choices,
            link=flags.link,
            zero1=args.zero1,
            sharding=args.sharding,
            shard_group=None if args.shard_group is None else positive_int(args.shard_group, "--shard-group"),
            overlap=args.overlap,
            sequence_parallel=not args.no_sequence_parallel,
            cluster=dict(flags.cluster),
            device=spec,
            counts=counts,
            device_files=args.device_file,
            progress=progress,
            words=cli_words(),
        )
        return result.plan, _parallel_note(flags.gpus, result)

    plan = api.plan_profile(
        profile,
        devices=flags.devices,
        batch_size=flags.batch_size,
        memory=flags.memory_limit,
        choices=flags.choices,
        link=flags.link,
        balance=flags.balance,
        device=spec,
        progress=progress,
        words=cli_words(),
    )
    return plan, ""


# the profiling flags and their defaults: given with a --profile (measured already) or to an
# analytic plan (nothing timed), they would do nothing, so they are refused rather than ignored
_MEASURING_FLAGS = (
    ("--micro-batch-sizes", "micro_batch_sizes", None, True),
    ("--tracer", "tracer", "auto", True),
    ("--leaf", "leaf", None, True),
    ("--blocks", "blocks", None, True),
    ("--warmup", "warmup", "2", False),
    ("--repeat", "repeat", "5", False),
    ("--threads", "threads", "1", False),
)  # flag, attribute, default, whether an analytic plan (which traces MODEL) uses it


def _check_unused_measuring_flags(args: argparse.Namespace) -> None:
    """UsageError for a flag that changes nothing in this plan (the user meant something by it)."""
    analytic = wants_analytic(args.device, args.analytic)
    for flag, attr, default, traced in _MEASURING_FLAGS:
        if getattr(args, attr) == default:
            continue
        if args.profile is not None:
            raise UsageError(
                f"{flag} applies when MODEL is profiled; --profile {args.profile} is measured already: drop {flag}"
            )
        if analytic and not traced:
            raise UsageError(f"{flag} applies to measured plans; an analytic plan times nothing: drop {flag}")
    if args.profile is not None and args.model is None and args.load_timeout is not None:
        raise UsageError("--load-timeout limits the model file's calls; with --profile alone none is imported: drop it")


def _profile_for_plan(
    args: argparse.Namespace, flags: PlanFlags, progress: ProgressCallback | None
) -> tuple[Profile, DeviceSpec | None, ModelCounts | None]:
    """The profile to plan (read, counted or measured), the catalogue device it is priced for,
    and the counts behind an analytic one (priced again per tensor-parallel degree)."""
    from autopipe import api

    analytic = wants_analytic(args.device, args.analytic)
    if args.profile is not None:
        profile = api.Profile.load(args.profile)
        if args.model is not None:
            api.check_profile_of(args.model, api.parse_kwargs(args.kwargs), args.profile, profile)
        spec = device_for(args.device, args.device_file, args.calibration) if analytic else None  # links and memory
        return profile, spec, None
    if analytic:
        spec = device_for(args.device, args.device_file, args.calibration)
        if args.model is None:
            raise UsageError("--device NAME plans MODEL analytically; give MODEL (a --profile is already priced)")
        counts = analytic_counts_for_plan(args.model, args.kwargs, spec, analytic_options(args), progress)
        return api.price(counts, spec), spec, counts
    options = profiling_options(args, flags.batch_size, api.plan_micro_batch_sizes(flags.batch_size))
    return measure(args.model, args.kwargs, options, progress), None, None


def _parallel_note(gpus: int, result: ParallelPlan) -> str:
    """Lines on the S x D choice of ``--gpus``: the choice, and the splits that did not fit."""
    lines = [f"tensor x pipeline x data parallel on {gpus} devices: {result.plan.parallel_note}"]
    if result.rejected:
        deepest = sorted(
            result.rejected, key=lambda r: -r.tensor_parallel * max(r.stages, 1)
        )  # the closest to fitting first
        shown = [_split_name(r) + f" ({_short(r)})" for r in deepest]
        more = f"; and {len(shown) - 6} more splits" if len(shown) > 8 else ""
        lines.append("no plan for: " + "; ".join(shown[:6] if more else shown) + more)
    if result.pruned:
        many = "splits" if result.pruned > 1 else "split"
        lines.append(
            f"{result.pruned} more {many} skipped: no plan of theirs can beat the runner-up "
            "(a bound, or their search against it)"
        )
    return "\n".join(lines)


def _split_name(r: Rejected) -> str:
    if not r.stages:
        return f"t={r.tensor_parallel}"
    if not r.data_parallel:  # the stages do not fit the devices left by t: no D to name
        return f"t={r.tensor_parallel} x S={r.stages}"
    return f"t={r.tensor_parallel} x S={r.stages} x D={r.data_parallel}"


def _short(rejected: Rejected) -> str:
    """Why an (S, D) split has no plan, short: the smallest limit that fits, when known."""
    if rejected.min_memory_bytes is not None:
        return "needs " + format_bytes(rejected.min_memory_bytes, round_up=True)
    return rejected.reason.split(" per device", 1)[0]


def cmd_show(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.plans import Plan
    from autopipe.show.draw import too_many_actions

    timeline = _timeline_path(args.timeline)
    plan = Plan.load(args.plan)
    big = too_many_actions(plan)
    if timeline and big:
        raise UsageError(f"--timeline {timeline}: {big}; show the plan without --timeline")
    _show(plan, out, args.json, timeline, wrote=None, text_timeline=True, source=args.plan)
    return 0


def _show(
    plan: Plan,
    out: Console,
    as_json: bool,
    timeline: str | None,
    wrote: str | None,
    text_timeline: bool = False,
    source: str = "the plan",
) -> None:
    from autopipe.api import plan_costs, plan_timeline
    from autopipe.show.draw import check_times, draw_timeline, plan_frame, too_many_actions
    from autopipe.show.draw import text_timeline as text_rows

    big = too_many_actions(plan)  # nothing simulated beyond it: show and plan stay bounded
    wanted = bool(timeline or (text_timeline and not as_json)) and big is None
    if wanted:
        check_times(plan, source)
    simulated = plan_timeline(plan) if wanted else None
    shown = plan_frame(plan, simulated) if simulated is not None else None  # what is drawn: bounded
    if timeline and simulated is not None:
        try:
            draw_timeline(plan, simulated, timeline, plan_costs(plan), shown)
        except OutputError as e:  # a full disk: the plan written before it stays, and the line says so
            if wrote is None:
                raise
            raise OutputError(f"{wrote}, but {e}") from None
    if as_json:
        print(json.dumps(plan_json(plan), indent=1), file=out.file)
        return
    rows = (
        text_rows(plan, simulated, letters=not out.is_terminal, shown=shown)
        if text_timeline and simulated is not None
        else None
    )
    drew = (f"drew {timeline}" if big is None else f"did not draw {timeline}: {big}") if timeline else None
    if big is not None and text_timeline and not timeline:
        drew = f"no timeline: {big}"
    notes = [n for n in (wrote, drew) if n]
    print_plan(plan, out, rows, "; ".join(notes) or None)
