"""``autopipe plan`` and ``autopipe show``: parse, call the planner, print.

The flags are parsed into typed values here; what they leave out (devices, memory limit,
link, cost per action, bytes per parameter) is decided by :mod:`autopipe.planner.defaults`,
the same code ``autopipe.plan`` calls.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console

from autopipe.schedules import schedule_names
from autopipe.units import format_bytes, parse_bytes, parse_duration, parse_rate

from .analytic_cmd import (
    add_analytic_arguments,
    analytic_counts_for_plan,
    analytic_options,
    device_for,
    wants_analytic,
)
from .args import UsageError, balance_list, output_path, positive_int
from .common import MEASURE_DEVICE_HELP, add_profiling_arguments, profiling_options
from .profile_cmd import measure
from .progress import ProgressCallback, progress_bar
from .render_plan import plan_json, print_plan

if TYPE_CHECKING:
    from autopipe.costs.analytic import ModelCounts
    from autopipe.costs.profile import Profile
    from autopipe.planner.parallel import ParallelPlan, Rejected
    from autopipe.plans import Plan

__all__ = ["PlanFlags", "add_plan_parsers", "plan_flags"]

DEFAULT_BATCH = 32
_T = TypeVar("_T")


def add_plan_parsers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "plan", help="choose stage cuts, micro-batches, schedule and recomputation; write plan.json",
        description="Plan pipeline parallelism for MODEL (profiling it first) or for a saved --profile.",
    )  # fmt: skip
    p.add_argument("model", metavar="MODEL", nargs="?", help="model file, path/to/model.py[:factory] (optional with --profile)")
    p.add_argument("-k", dest="kwargs", metavar="KEY=VALUE", action="append", default=[], help="factory keyword argument (repeatable)")
    p.add_argument("--profile", default=None, help="plan from this profile JSON instead of profiling MODEL")
    p.add_argument("--stages", default=None, help="pipeline devices (default: the visible GPUs, else 4)")
    p.add_argument("--memory", default=None, help="memory per device, like 16GiB or 80GB (default: the device's memory)")
    p.add_argument("--batch-size", default=str(DEFAULT_BATCH), help=f"samples per iteration (default: {DEFAULT_BATCH})")
    p.add_argument("--micro-batches", default=None, help="pin the micro-batch count")
    p.add_argument("--schedule", default=None, choices=schedule_names(), help="pin the schedule")
    p.add_argument("--virtual", default=None, help="pin the virtual stages per device (interleaved-1f1b)")
    p.add_argument(
        "--balance", default=None, metavar="N,N,...",
        help="price your own split: blocks per chunk in chunk order (S entries; S x v with --schedule for interleaved/V "
        "schedules); the plan is your split, autopipe's best is shown beside it",
    )  # fmt: skip
    p.add_argument("--no-recompute", action="store_true", help="never recompute activations")
    p.add_argument("--recompute-all", action="store_true", help="recompute activations on every stage")
    p.add_argument("--bandwidth", default=None, help="link bandwidth, like 25GB/s (default: by device type)")
    p.add_argument("--latency", default=None, help="link latency, like 20us (default: by device type)")
    p.add_argument(
        "--action-overhead", default=None, help="the executor's own time per F, B or W action, like 0.2ms (default: by device type)"
    )
    p.add_argument("-o", "--output", default="plan.json", help="plan file to write (default: plan.json)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--timeline", default=None, metavar="FILE", help="draw the schedule as a Gantt chart (.png or .svg)")
    add_profiling_arguments(
        p, MEASURE_DEVICE_HELP + "; or a catalogue device (h100, h200, a100-80gb, a100-40gb, or your "
        "--device-file's) to plan analytically on the meta device",
    )  # fmt: skip
    add_analytic_arguments(p)
    p.set_defaults(func=cmd_plan)

    s = commands.add_parser(
        "show", help="print a saved plan again, with a text timeline",
        description="Print PLAN's stages, schedule and baselines again, with a text timeline of one "
        "iteration (or one JSON object with --json); --timeline also draws it to a .png or .svg.",
    )  # fmt: skip
    s.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    s.add_argument("--timeline", default=None, metavar="FILE", help="draw the schedule as a Gantt chart (.png or .svg)")
    s.set_defaults(func=cmd_show)


@dataclass(frozen=True)
class PlanFlags:
    """``autopipe plan``'s own flags, checked; ``None`` leaves the choice to the library's
    defaults (:mod:`autopipe.planner.defaults`) or to the search."""

    batch_size: int
    stages: int | None  # pipeline devices
    micro_batches: int | None
    virtual: int | None
    memory_limit: float | None  # bytes per device
    bandwidth: float | None
    latency_s: float | None
    action_overhead_s: float | None
    recompute: str  # "auto" | "never" | "always"
    gpus: int | None
    output: str
    timeline: str | None
    tensor_parallel: int | None = None  # pin t (with gpus)
    data_parallel: int | None = None  # pin D (with gpus)
    cluster: tuple[tuple[str, float], ...] = ()  # --cluster FILE: Cluster field -> value
    balance: tuple[int, ...] | None = None  # blocks per chunk, in chunk order (--balance)


def _optional(text: str | None, parse: Callable[[str, str], _T], flag: str) -> _T | None:
    return parse(text, flag) if text is not None else None


def plan_flags(args: argparse.Namespace) -> PlanFlags:
    """Parse and check the flags of ``autopipe plan`` (fast: before any profiling)."""
    batch = positive_int(args.batch_size, "--batch-size")
    stages = _optional(args.stages, positive_int, "--stages")
    micro = _optional(args.micro_batches, positive_int, "--micro-batches")
    virtual = _optional(args.virtual, positive_int, "--virtual")
    memory = _optional(args.memory, parse_bytes, "--memory")
    bandwidth = _optional(args.bandwidth, parse_rate, "--bandwidth")
    latency = _optional(args.latency, parse_duration, "--latency")
    overhead = _optional(args.action_overhead, parse_duration, "--action-overhead")
    if args.no_recompute and args.recompute_all:
        raise UsageError("--no-recompute and --recompute-all contradict each other; give one")
    output = str(output_path(args.output, "--output"))
    timeline = _timeline_path(args.timeline)
    if args.profile is None and args.model is None:
        raise UsageError("give a MODEL to profile or --profile profile.json")
    if args.dtype is not None and not wants_analytic(args.device, args.analytic):
        raise UsageError(f"--dtype {args.dtype} applies to analytic plans; add --device NAME (e.g. h100) or --analytic")
    gpus = _optional(args.gpus, positive_int, "--gpus")
    if args.zero1 and gpus is None:
        raise UsageError("--zero1 shards optimizer state across data-parallel replicas; give --gpus G as well")
    recompute = "never" if args.no_recompute else "always" if args.recompute_all else "auto"
    balance = _optional(args.balance, balance_list, "--balance")
    if balance is not None and gpus is not None:
        raise UsageError("--balance prices one pipeline's split and --gpus searches data x pipeline layouts; give one")
    tensor = _optional(args.tensor_parallel, positive_int, "--tensor-parallel")
    data = _optional(args.data_parallel, positive_int, "--data-parallel")
    for flag, given in (("--tensor-parallel", tensor), ("--data-parallel", data), ("--cluster", args.cluster),
                        ("--no-sequence-parallel", args.no_sequence_parallel or None)):  # fmt: skip
        if given is not None and gpus is None:
            raise UsageError(f"{flag} applies to the devices of --gpus G; give --gpus as well")
    if gpus is not None:
        from autopipe.planner.cluster import check_degrees

        check_degrees(gpus, [("--tensor-parallel", tensor), ("--stages", stages), ("--data-parallel", data)], "--gpus")
    from autopipe.costs.devices import read_cluster_file

    cluster = tuple(read_cluster_file(args.cluster).items()) if args.cluster is not None else ()
    return PlanFlags(
        batch, stages, micro, virtual, memory, bandwidth, latency, overhead, recompute, gpus, output, timeline, tensor, data, cluster, balance
    )  # fmt: skip


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
    from autopipe.planner.defaults import parallel_request, plan_micro_batch_sizes, plan_request

    analytic = wants_analytic(args.device, args.analytic)
    spec = None
    counts: ModelCounts | None = None
    if args.profile is not None:
        from autopipe.costs.profile import Profile

        profile = Profile.load(args.profile)
        if args.model is not None:
            _check_fingerprint(args.model, args.kwargs, args.profile, profile)
        if analytic:
            spec = device_for(args.device, args.device_file, args.calibration)  # links and memory of the named device
    elif analytic:
        spec = device_for(args.device, args.device_file, args.calibration)
        if args.model is None:
            raise UsageError("--device NAME plans MODEL analytically; give MODEL (a --profile is already priced)")
        from autopipe.costs.analytic import profile_from_counts

        counts = analytic_counts_for_plan(args.model, args.kwargs, spec, analytic_options(args), progress)
        profile = profile_from_counts(counts, spec)  # with --gpus, priced again per tensor-parallel degree
    else:
        options = profiling_options(args, flags.batch_size, plan_micro_batch_sizes(flags.batch_size))
        profile = measure(args.model, args.kwargs, options, progress)
    note = ""
    if flags.gpus is not None:
        from autopipe.planner.cluster import tensor_options
        from autopipe.planner.parallel import plan_parallel

        parallel = parallel_request(
            profile, gpus=flags.gpus, stages=flags.stages, batch_size=flags.batch_size,
            memory_limit=flags.memory_limit, micro_batches=flags.micro_batches, schedule=args.schedule,
            virtual=flags.virtual, recompute=flags.recompute, link_bandwidth=flags.bandwidth,
            link_latency_s=flags.latency_s, action_overhead_s=flags.action_overhead_s, device=spec,
            device_files=args.device_file, shard_optimizer=args.zero1,
        )  # fmt: skip
        cluster = replace(parallel.cluster, **dict(flags.cluster))  # type: ignore[arg-type]
        parallel = replace(parallel, cluster=cluster, tensor_parallel=flags.tensor_parallel, data_parallel=flags.data_parallel)
        tensor = tensor_options(counts, spec, cluster, not args.no_sequence_parallel) if counts is not None and spec is not None else None
        result = plan_parallel(profile, parallel, progress, tensor)
        plan, note = result.plan, _parallel_note(flags.gpus, result)
    else:
        from autopipe.planner.balance import plan_balance
        from autopipe.planner.search import plan_pipeline

        request = plan_request(
            profile, devices=flags.stages, batch_size=flags.batch_size, memory_limit=flags.memory_limit,
            micro_batches=flags.micro_batches, schedule=args.schedule, virtual=flags.virtual,
            recompute=flags.recompute, link_bandwidth=flags.bandwidth, link_latency_s=flags.latency_s,
            action_overhead_s=flags.action_overhead_s, device=spec,
        )  # fmt: skip
        plan = plan_pipeline(profile, request, progress) if flags.balance is None else plan_balance(profile, request, flags.balance)
    return plan, note


def _parallel_note(gpus: int, result: ParallelPlan) -> str:
    """Lines on the S x D choice of ``--gpus``: the choice, and the splits that did not fit."""
    lines = [f"tensor x pipeline x data parallel on {gpus} devices: {result.plan.parallel_note}"]
    if result.rejected:
        deepest = sorted(result.rejected, key=lambda r: -r.tensor_parallel * max(r.stages, 1))  # the closest to fitting first
        shown = [_split_name(r) + f" ({_short(r)})" for r in deepest]
        more = f"; and {len(shown) - 6} more splits" if len(shown) > 8 else ""
        lines.append("no plan for: " + "; ".join(shown[:6] if more else shown) + more)
    if result.pruned:
        many = "splits" if result.pruned > 1 else "split"
        lines.append(f"{result.pruned} more {many} skipped: no plan of theirs can beat the runner-up (a bound, or their search against it)")
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


def _check_fingerprint(model: str, kwargs: list[str], profile_path: str, profile: Profile) -> None:
    from autopipe.errors import ProfileError
    from autopipe.graph.trace import trace_model
    from autopipe.model.load import load_model, parse_kwargs

    loaded = load_model(model, parse_kwargs(kwargs))
    u = min(profile.micro_batch_sizes)  # traced the way the profile was (api.fingerprint_of)
    traced = trace_model(loaded.model, loaded.make_inputs(u), micro_batch_size=u, recipe=profile.recipe, source=loaded.spec.path)
    have = traced.fingerprint()
    want = profile.recipe.fingerprint
    if have != want:
        raise ProfileError(
            f"{profile_path} was made from another model (fingerprint {want}, {model} has {have}); "
            f"profile this model again with 'autopipe profile {model}'"
        )
    profile.check_blocks([(b.name, b.nodes) for b in traced.blocks], profile_path)  # a hand-edited profile


def cmd_show(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.plans import Plan

    timeline = _timeline_path(args.timeline)
    plan = Plan.load(args.plan)
    _show(plan, out, args.json, timeline, wrote=None, text_timeline=True, source=args.plan)
    return 0


def _show(
    plan: Plan, out: Console, as_json: bool, timeline: str | None, wrote: str | None, text_timeline: bool = False,
    source: str = "the plan",
) -> None:  # fmt: skip
    from autopipe.planner.assemble import plan_costs, plan_timeline
    from autopipe.show.draw import check_times, draw_timeline, plan_frame
    from autopipe.show.draw import text_timeline as text_rows

    wanted = bool(timeline or (text_timeline and not as_json))
    if wanted:
        check_times(plan, source)
    simulated = plan_timeline(plan) if wanted else None
    shown = plan_frame(plan, simulated) if simulated is not None else None  # what is drawn: bounded
    if timeline and simulated is not None:
        draw_timeline(plan, simulated, timeline, plan_costs(plan), shown)
    if as_json:
        print(json.dumps(plan_json(plan), indent=1), file=out.file)
        return
    rows = text_rows(plan, simulated, letters=not out.is_terminal, shown=shown) if text_timeline and simulated is not None else None
    notes = [n for n in (wrote, f"drew {timeline}" if timeline else None) if n]
    print_plan(plan, out, rows, "; ".join(notes) or None)
