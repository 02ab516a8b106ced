"""``autopipe plan`` and ``autopipe show``: parse, call the planner, print."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from rich.console import Console

from autopipe.units import parse_bytes, parse_duration, parse_rate

from .analytic_cmd import (
    add_analytic_arguments,
    analytic_profile_for_plan,
    device_for,
    wants_analytic,
)
from .args import UsageError, default_micro_batch_sizes, output_path, positive_int
from .render_plan import plan_json, print_plan

if TYPE_CHECKING:
    from autopipe.costs.devices import DeviceSpec
    from autopipe.costs.profile import Profile
    from autopipe.plans import Plan

__all__ = ["add_plan_parsers"]

DEFAULT_BATCH = 32
DEFAULT_STAGES_WITHOUT_GPUS = 4


def add_plan_parsers(commands: argparse._SubParsersAction, add_model: object, add_profiling: object) -> None:  # type: ignore[type-arg]
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
    p.add_argument("--schedule", default=None, choices=("gpipe", "1f1b", "interleaved-1f1b", "zb-h1"), help="pin the schedule")
    p.add_argument("--virtual", default=None, help="pin the virtual stages per device (interleaved-1f1b)")
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
    add_profiling(p)  # type: ignore[operator]
    add_analytic_arguments(p)
    p.set_defaults(func=cmd_plan)

    s = commands.add_parser("show", help="print a saved plan again, with a text timeline")
    s.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    s.add_argument("--timeline", default=None, metavar="FILE", help="draw the schedule as a Gantt chart (.png or .svg)")
    s.set_defaults(func=cmd_show)


def _device_memory(device: str) -> float:
    if device.startswith("cuda"):
        import torch

        return float(torch.cuda.get_device_properties(0).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _default_stages() -> int:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return n if n >= 2 else DEFAULT_STAGES_WITHOUT_GPUS


def _timeline_path(text: str | None) -> str | None:
    if text is None:
        return None
    path = output_path(text, "--timeline")
    if path.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--timeline {text}: use a .png or .svg file name")
    return str(path)


def cmd_plan(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.costs.analytic import state_factor
    from autopipe.costs.profile import Profile
    from autopipe.solve.search import (
        PlanRequest,
        default_action_overhead,
        default_link,
        plan_pipeline,
    )

    batch = positive_int(args.batch_size, "--batch-size")
    stages = positive_int(args.stages, "--stages") if args.stages is not None else None
    micro = positive_int(args.micro_batches, "--micro-batches") if args.micro_batches is not None else None
    virtual = positive_int(args.virtual, "--virtual") if args.virtual is not None else None
    memory = parse_bytes(args.memory, "--memory") if args.memory is not None else None
    bandwidth = parse_rate(args.bandwidth, "--bandwidth") if args.bandwidth is not None else None
    latency = parse_duration(args.latency, "--latency") if args.latency is not None else None
    overhead = parse_duration(args.action_overhead, "--action-overhead") if args.action_overhead is not None else None
    if args.no_recompute and args.recompute_all:
        raise UsageError("--no-recompute and --recompute-all contradict each other; give one")
    output = str(output_path(args.output, "--output"))
    timeline = _timeline_path(args.timeline)
    if args.profile is None and args.model is None:
        raise UsageError("give a MODEL to profile or --profile profile.json")
    if args.dtype is not None and not wants_analytic(args):
        raise UsageError(f"--dtype {args.dtype} applies to analytic plans; add --device NAME (e.g. h100) or --analytic")

    from .main import profile_for_plan

    spec = None
    if args.profile is not None:
        profile = Profile.load(args.profile)
        if args.model is not None:
            _check_fingerprint(args, profile)
        if wants_analytic(args):
            spec = device_for(args)  # links and memory of the named device
    elif wants_analytic(args):
        spec = device_for(args)
        profile = analytic_profile_for_plan(args, spec)
    else:
        args.micro_batch_sizes = args.micro_batch_sizes or ",".join(map(str, default_micro_batch_sizes(min(batch, 8))))
        profile = profile_for_plan(args, err)
    link_bw, link_lat = default_link(profile.device) if spec is None else (spec.nvlink_bandwidth, spec.link_latency_s)
    memory = memory or (spec.memory_bytes if spec is not None else _device_memory(profile.device))
    recompute = "never" if args.no_recompute else "always" if args.recompute_all else "auto"
    overhead = default_action_overhead(profile.device) if overhead is None else overhead
    factor = state_factor(profile) if profile.method == "analytic" else PlanRequest.state_factor
    note = ""
    if args.gpus is not None:
        plan, note = _plan_parallel(
            args, profile, spec, batch, memory, stages, micro, virtual, recompute, bandwidth, latency, overhead
        )
    else:
        if args.zero1:
            raise UsageError("--zero1 shards optimizer state across data-parallel replicas; give --gpus G as well")
        request = PlanRequest(
            devices=stages or _default_stages(),
            batch_size=batch,
            memory_limit=memory,
            micro_batches=micro,
            schedule=args.schedule,
            virtual=virtual,
            recompute=recompute,
            link_bandwidth=bandwidth or link_bw,
            link_latency_s=link_lat if latency is None else latency,
            action_overhead_s=overhead,
            state_factor=factor,
        )
        plan = plan_pipeline(profile, request)
    plan.save(output)
    _show(plan, out, args.json, timeline, wrote=f"wrote {output}")
    if note and not args.json:
        out.print(note)
    return 0


def _plan_parallel(
    args: argparse.Namespace, profile: Profile, spec: DeviceSpec | None, batch: int, memory: float,
    stages: int | None, micro: int | None, virtual: int | None, recompute: str,
    bandwidth: float | None, latency: float | None, overhead: float,
) -> tuple[Plan, str]:  # fmt: skip
    """``--gpus G``: the best S x D split; returns the plan and lines on the choice."""
    from autopipe.costs.analytic import BYTES_PER_PARAM
    from autopipe.costs.devices import device_spec, match_device
    from autopipe.solve.parallel import Cluster, ParallelRequest, plan_parallel
    from autopipe.solve.search import PlanRequest, default_link

    gpus = positive_int(args.gpus, "--gpus")
    if spec is None:
        name = match_device(profile.device, args.device_file)
        spec = device_spec(name, args.device_file) if name is not None else None
    if spec is not None:
        cluster = Cluster.of(spec, gpus)
    else:
        bw, lat = default_link(profile.device)
        cluster = Cluster(gpus, gpus, bw, bw, lat)
    if bandwidth is not None or latency is not None:
        cluster = Cluster(
            gpus, cluster.devices_per_node, bandwidth or cluster.nvlink_bandwidth, bandwidth or cluster.network_bandwidth,
            cluster.link_latency_s if latency is None else latency,
        )  # fmt: skip
    per_param = BYTES_PER_PARAM if profile.method == "analytic" else PlanRequest.state_factor * _element_size(profile)
    result = plan_parallel(
        profile,
        ParallelRequest(
            cluster, batch, memory, bytes_per_param=per_param, shard_optimizer=args.zero1, stages=stages,
            micro_batches=micro, schedule=args.schedule, virtual=virtual, recompute=recompute,
            action_overhead_s=overhead,
        ),
    )  # fmt: skip
    lines = [f"data x pipeline parallel on {gpus} devices: {result.plan.parallel_note}"]
    if result.rejected:
        lines.append("no plan for: " + "; ".join(f"S={r.stages} x D={r.data_parallel} ({_short(r.reason)})" for r in result.rejected))
    return result.plan, "\n".join(lines)


def _short(reason: str) -> str:
    marker = "the smallest limit that fits is "
    if marker in reason:
        return "needs " + reason.split(marker, 1)[1].split(" per device", 1)[0]
    return reason.split(" per device", 1)[0]


def _element_size(profile: Profile) -> float:
    params = sum(b.params for b in profile.blocks)
    return sum(b.param_bytes for b in profile.blocks) / params if params else 4.0


def _check_fingerprint(args: argparse.Namespace, profile: Profile) -> None:
    from autopipe.api import fingerprint_of
    from autopipe.errors import ProfileError
    from autopipe.model.load import load_model, parse_kwargs

    loaded = load_model(args.model, parse_kwargs(args.kwargs))
    have = fingerprint_of(loaded, profile)
    want = profile.fingerprint
    if have != want:
        raise ProfileError(
            f"{args.profile} was made from another model (fingerprint {want}, {args.model} has {have}); "
            f"profile this model again with 'autopipe profile {args.model}'"
        )


def cmd_show(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.plans import Plan

    timeline = _timeline_path(args.timeline)
    plan = Plan.load(args.plan)
    _show(plan, out, args.json, timeline, wrote=None, text_timeline=True)
    return 0


def _show(plan: Plan, out: Console, as_json: bool, timeline: str | None, wrote: str | None, text_timeline: bool = False) -> None:
    from autopipe.schedules.draw import draw_timeline
    from autopipe.schedules.draw import text_timeline as text_rows
    from autopipe.solve.assemble import plan_timeline

    simulated = plan_timeline(plan) if (timeline or text_timeline) else None
    if timeline and simulated is not None:
        draw_timeline(plan, simulated, timeline)
    if as_json:
        print(json.dumps(plan_json(plan), indent=1), file=out.file)
        return
    rows = text_rows(plan, simulated) if text_timeline and simulated is not None else None
    extra = f"; drew {timeline}" if timeline else ""
    print_plan(plan, out, rows, (wrote + extra) if wrote else (extra.lstrip("; ") or None))
