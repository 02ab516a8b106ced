# Run: python bench/bench_published.py [--rows NAME,...] [--no-free] [--write-plans DIR] [--sources]   (repo root)
#      python bench/bench_published.py --deepseek-h800 [--no-free]   (the DeepSeek-V3 report below)
"""Published end-to-end training runs, planned: predicted against published throughput (issue 24, item 4).

The runs are data (``bench/published_runs.py``: the model, cluster, layout, figure and source of
each). Each row's model is built from a bundled model file on the meta device, counted once in
the run's dtype and priced analytically on the catalogue device with the run's inter-node link,
then planned twice:

- *pinned*: the published layout in the words the planner has today (:func:`layout_choices`:
  t, p, d, the micro-batch count where the micro-batch size is published, virtual stages where
  published, full or no recomputation, the sharding as published (ZeRO-1, ZeRO-2, FSDP as ZeRO-3),
  sequence parallelism; Megatron-LM's own schedules, 1F1B and interleaved 1F1B, with uniform
  recomputation), whatever is not published searched (unpublished virtual stages: 1F1B and each v
  Megatron-LM runs, :func:`virtuals`).
  Priced as the run ran: Megatron-LM's fused kernels (``Target.fused_kernels``, ``costs.fusion``),
  attention as the row says (``Run.attention``: the fused kernel, or the scores materialised before
  FlashAttention), the overlaps the source names (:func:`overlap_of`). Its predicted throughput,
  in the source's own unit and FLOP count (model or hardware FLOPs as the source counts them;
  tokens/s; seconds per step), against the published figure: ``error`` = predicted / published - 1.
- *free*: the full t x p x d search over every schedule, recomputation chosen, with the run's
  GPUs, batch and device memory (and its sharding flag: the search cannot choose sharding yet);
  its step against the pinned one.

Mixture-of-experts rows (``Run.ep`` > 1) are priced per layout by ``costs.options`` at the row's
imbalance (1.0: the source force-balances the routing), ep pinned in the pinned plan and searched
with cp in the free one; the expert all-to-all is hidden where the target's schedule hides it
(``planner.cluster.experts``).

``--deepseek-h800``: DeepSeek-V3 as DeepSeek trained it (Sec. 3 of the technical report: 2,048
H800s, PP 16 x EP 64 x ZeRO-1 data parallelism over 128, no tensor parallelism, DualPipe, 15,360
sequences of 4,096 tokens, FP8, the dispatch in FP8 and deduplicated per node, each token's
experts on at most 4 nodes; no throughput published): the pinned layout against the free search's
choice, and the predicted gain.

Calibration: one row per device type and dtype (``published_runs.CALIBRATION``) scales that
device's compute efficiencies once (``DeviceSpec.compute_scaled``, one step, not iterated) so that
its pinned prediction meets its figure; every other row is held out, and the last line gives the
held-out rows' median and worst |error| (rows whose figures could not be verified are printed
but left out). Memory: each row prints the pinned plan's predicted peak per device; a published
run fitted, so a layout that does not fit the device as predicted is planned again without the
limit, its time still predicted, and named. One CPU core.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from published_runs import (
    CALIBRATION,
    DEEPEP_SMS,
    DEEPSEEK_SMS,
    DEVICE_SMS,
    HW,
    LINKS,
    RUNS,
    STEP,
    TFLOPS,
    TOKENS,
    Run,
    by_name,
)

from autopipe.costs.analytic import ModelCounts, count_model, profile_from_counts
from autopipe.costs.devices import DeviceSpec, device_spec
from autopipe.costs.losses import megatron_cross_entropy
from autopipe.costs.options import Links, ParallelOptions, parallel_options
from autopipe.errors import InfeasibleError
from autopipe.model.load import load_model
from autopipe.modes import Recompute, Sharding
from autopipe.planner.cluster import target_overlap, tensor_options
from autopipe.planner.parallel import Cluster, ParallelRequest, plan_parallel
from autopipe.planner.request import Choices
from autopipe.plans import Overlap, Plan
from autopipe.schedules.targets import target_spec
from autopipe.units import format_bytes

ROOT = Path(__file__).resolve().parent.parent
UNBOUNDED = 1e15  # bytes: the memory limit of a layout planned again after it did not fit


@dataclass(frozen=True)
class Pinned:
    """A run's published layout as the planner is told it (:func:`layout_choices`)."""

    tensor_parallel: int
    stages: int
    data_parallel: int
    choices: Choices  # micro-batches, schedule, virtual stages, recomputation; target Megatron-LM
    shard_optimizer: bool  # the state sharded over the replicas (the free search's flag)
    sharding: Sharding | None  # how: ZeRO-1 (distributed optimizer), ZeRO-2, ZeRO-3 (FSDP); None: not
    sequence_parallel: bool
    approximated: tuple[str, ...]  # published choices priced as something else, and as what


def layout_choices(run: Run) -> Pinned:
    """What of ``run``'s published layout the planner can express, and how the rest is priced.

    Expressed: t, p, d; ``mbs`` as m = global batch / (d mbs); ``vp`` > 1 as interleaved 1F1B with
    v = vp, ``vp`` = 1 (or p = 1) as 1F1B, None left to the search among Megatron's two; full
    recomputation as every stage recomputed, none as none, unknown left to the search (uniform,
    as Megatron runs it); selective recomputation of the source's modules (``Run.recompute_modules``)
    as those module kinds recomputed in every layer that has them; the sharding as the run's (zero1:
    Megatron's distributed optimizer; zero2: optimizer state and gradients sharded, the gradients
    reduce-scattered each micro-batch; fsdp: ZeRO-3, the weights gathered per use); sequence
    parallelism. Approximated (named in ``approximated``): selective recomputation without its
    modules as none (the counts price fused attention, which keeps what Megatron's default
    selective recomputation, core_attn, keeps); fsdp-step (FSDP gathering the weights once a step,
    the gradients reduce-scattered once: zero3-step, which Megatron-LM does not run) as ZeRO-1,
    whose state and collectives the planner prices the same. Each new planner choice (selective or
    partial recomputation, offload, overlap) is one more field here, read from the run's own fields."""
    approximated = []
    recompute = {"full": Recompute.ALWAYS, "none": Recompute.NEVER, "selective": Recompute.NEVER}.get(
        run.recompute, Recompute.AUTO
    )
    if run.recompute == "selective" and not run.recompute_modules:
        approximated.append("selective recomputation priced as none (fused attention keeps what it keeps)")
    if run.p == 1 or run.vp == 1:
        schedule, virtual = "1f1b", None
    elif run.vp is not None:
        schedule, virtual = "interleaved-1f1b", run.vp
    else:
        schedule, virtual = None, None
    micro_batches = run.global_batch // (run.d * run.mbs) if run.mbs else None
    modules = run.recompute_modules or None  # the source's modules, recomputed in every layer that has them
    if modules:  # selective recomputation: no stage is recomputed whole (the planner's one memory choice)
        recompute = Recompute.AUTO
    choices = Choices(micro_batches, schedule, virtual, recompute, target="megatron", recompute_modules=modules)
    sharding = {"zero1": Sharding.ZERO1, "zero2": Sharding.ZERO2, "fsdp": Sharding.ZERO3}.get(run.sharding)
    if run.sharding == "fsdp-step":  # Megatron-LM has no zero3-step; the planner prices zero3-step as zero1
        sharding = Sharding.ZERO1
        approximated.append(
            "FSDP gathering once a step priced as the distributed optimizer (ZeRO-1: the same state and collectives, "
            "planner/placement.py's zero3-step; its reductions in Megatron's buckets)"
        )
    sp = run.sequence_parallel and run.t > 1
    return Pinned(run.t, run.p, run.d, choices, sharding is not None, sharding, sp, tuple(approximated))


FUSED = target_spec("megatron").fused_kernels  # every row ran Megatron-LM's (or Megatron-DeepSpeed's) fused kernels


@functools.cache
def _counts(
    model: str, kwargs: tuple[tuple[str, object], ...], dtype: str, attention: str, loss_fusion: bool
) -> ModelCounts:
    loaded = load_model(str(ROOT / "models" / f"{model}.py"), dict(kwargs), device="meta")
    if not loss_fusion:  # the loss as Megatron-LM computes it unfused, its kernels kept apart
        loaded = replace(loaded, loss_fn=megatron_cross_entropy)
    sizes = (1, 2)
    return count_model(
        loaded, micro_batch_sizes=sizes, dtype=dtype, shallow=True, attention=attention, eager_loss=not loss_fusion
    )


def counts_of(run: Run) -> ModelCounts:
    return _counts(run.model, run.kwargs, run.dtype, run.attention, run.loss_fusion)


def overlap_of(run: Run) -> Overlap:
    """What the run overlapped, as the time model prices it: Megatron-LM's defaults (the target's:
    gradient reduction and parameter gather, asynchronous sends when interleaved; the first two
    not where the run's framework reduced after the pipeline, ``Run.dp_overlap``, the reduction not
    where the source turned it off, ``Run.grad_overlap``) and, where the
    source says it ran ``--tp-comm-overlap``, the tensor-parallel collectives pipelined with the
    GEMMs: Transformer Engine splits each all-gather / reduce-scatter GEMM into t chunks and moves
    one chunk while it multiplies another, so all but one chunk's transfer, (t - 1) / t, is hidden."""
    base = target_overlap("megatron")
    if not run.dp_overlap:
        base = replace(base, grad_reduce=False, param_gather=False)
    elif not run.grad_overlap:
        base = replace(base, grad_reduce=False)
    return replace(base, tp_comm=(run.t - 1) / run.t) if run.tp_comm_overlap and run.t > 1 else base


def cluster_of(run: Run, spec: DeviceSpec) -> Cluster:
    return replace(Cluster.of(spec, run.gpus), network_bandwidth=LINKS[run.link].network_bandwidth)


def predicted_figure(run: Run, plan: Plan) -> float:
    """The plan's throughput in the run's unit and FLOP count."""
    step = plan.step_time_s
    if run.unit == STEP:
        return step
    if run.unit == TOKENS:
        return run.global_batch * run.seq / step / run.gpus
    flops = plan.hardware_flops if run.flops == HW else plan.model_flops
    return flops / step / run.gpus / 1e12


def error(run: Run, predicted: float) -> float:
    """Predicted throughput over published, less 1 (a step time: published over predicted)."""
    return run.figure / predicted - 1 if run.unit == STEP else predicted / run.figure - 1


@dataclass(frozen=True)
class Pinning:
    plan: Plan
    fits: bool  # within the device's memory as predicted
    needs: float  # the predicted peak per device, bytes (over the limit where it does not fit)


INTERLEAVED = "interleaved-1f1b"
MAX_VIRTUAL = 8  # the most virtual stages tried where the run does not publish them (planning time)


def virtuals(run: Run) -> tuple[int, ...]:
    """Where a pipelined run does not publish its virtual stages: the v's Megatron-LM runs
    (``--num-layers-per-virtual-pipeline-stage``: each of the p x v chunks an equal whole number of
    layers, so v divides layers / p), up to :data:`MAX_VIRTUAL`, searched beside 1F1B in place of
    the planner's own interleaved choices (2 and 4, which need not divide); () where vp is published
    or layers / p is no whole number (the planner's search then)."""
    if run.vp is not None or run.p == 1:
        return ()
    layers = int(getattr(counts_of(run).loaded.model.config, "n_layer", 0))
    if not layers or layers % run.p:
        return ()
    per = layers // run.p
    return tuple(v for v in range(2, min(per, MAX_VIRTUAL) + 1) if per % v == 0)


def plan_pinned(run: Run, spec: DeviceSpec) -> Pinning:
    counts, pin = counts_of(run), layout_choices(run)
    cluster = cluster_of(run, spec)
    request = ParallelRequest(
        cluster,
        run.global_batch,
        spec.memory_bytes,
        shard_optimizer=pin.shard_optimizer,
        sharding=pin.sharding,
        stages=pin.stages,
        choices=pin.choices,
        tensor_parallel=pin.tensor_parallel,
        data_parallel=pin.data_parallel,
        overlap=overlap_of(run),
        context_parallel=run.cp,
        expert_parallel=run.ep if run.model == "moe" else None,
        expert_tensor_parallel=1 if run.model == "moe" else None,
        grad_reduce_fp32=run.grad_reduce_fp32,
    )
    profile = profile_from_counts(counts, spec, fused=FUSED)
    tensor = tensor_options(
        counts, spec, cluster, sequence_parallel=pin.sequence_parallel, overlap=overlap_of(run).tp_comm, fused=FUSED
    )
    parallel = options_of(run, spec, pin.sequence_parallel)
    plans = []
    valid = virtuals(run)
    pinned = [replace(pin.choices, schedule="1f1b", virtual=None)] if valid else [pin.choices]
    for choices in (*pinned, *(replace(pin.choices, schedule=INTERLEAVED, virtual=v) for v in valid)):
        try:
            plans.append(plan_parallel(profile, replace(request, choices=choices), None, tensor, parallel).plan)
        except InfeasibleError:
            continue
    if plans:
        plan = min(plans, key=lambda p: p.step_time_s)
        return Pinning(plan, True, max(plan.peak_memory_bytes))
    else:  # the run fitted: the memory model is off; price the layout all the same
        recompute = Recompute.ALWAYS if pin.choices.recompute == Recompute.AUTO else pin.choices.recompute
        again = replace(request, memory_limit=UNBOUNDED, choices=replace(pin.choices, recompute=recompute))
        plan = plan_parallel(profile, again, None, tensor, parallel).plan
        return Pinning(plan, False, max(plan.peak_memory_bytes))


def options_of(run: Run, spec: DeviceSpec, sequence_parallel: bool, **extra: Any) -> ParallelOptions:
    """Context and expert parallelism for ``run`` (its imbalance, its dispatcher; ``extra``:
    parallel_options' keywords, over the dispatcher's)."""
    links = Links.of(cluster_of(run, spec))
    if run.deepep:  # a token to a node once, to at most max_nodes; DeepEP's kernels hold some of the SMs
        share = DEEPEP_SMS / DEVICE_SMS[run.device]
        extra = {"deduplicate": True, "max_nodes": run.max_nodes, "alltoall_share": share, **extra}
    return parallel_options(
        counts_of(run),
        spec,
        links,
        sequence_parallel=sequence_parallel,
        imbalance=run.imbalance,
        tensor_overlap=overlap_of(run).tp_comm,
        fused=FUSED,
        **extra,
    )


def plan_free(run: Run, spec: DeviceSpec, shard_optimizer: bool) -> Plan | None:
    counts, cluster = counts_of(run), cluster_of(run, spec)
    request = ParallelRequest(
        cluster,
        run.global_batch,
        spec.memory_bytes,
        shard_optimizer=shard_optimizer,
        overlap=overlap_of(run),
        grad_reduce_fp32=run.grad_reduce_fp32,
    )
    tensor = tensor_options(counts, spec, cluster, sequence_parallel=True, overlap=overlap_of(run).tp_comm, fused=FUSED)
    parallel = options_of(run, spec, True)
    try:
        return plan_parallel(profile_from_counts(counts, spec, fused=FUSED), request, None, tensor, parallel).plan
    except InfeasibleError:
        return None


def calibrated(runs: list[Run]) -> tuple[dict[tuple[str, str], DeviceSpec], list[str]]:
    """Each family's device spec, scaled once on its calibration row; and a line per calibration."""
    specs, lines = {}, []
    for family in sorted({r.family for r in runs}):
        spec = device_spec(family[0])
        name = CALIBRATION.get(family)
        if name is not None:
            run = by_name(name)
            before = predicted_figure(run, plan_pinned(run, spec).plan)
            factor = 1.0 / (1.0 + error(run, before))
            spec = spec.compute_scaled(factor)
            lines.append(
                f"calibrated {family[0]} {family[1]} on {name}: x{factor:.3f}, {family[1]} GEMM eff_max "
                f"{spec.plateau(family[1]):.3f}"
            )
        else:
            lines.append(f"{family[0]} {family[1]}: no calibration row, the catalogue's efficiencies")
        specs[family] = spec
    return specs, lines


def _layout(run: Run) -> str:
    words = [f"t{run.t} p{run.p} d{run.d}"]
    words += [f"cp{run.cp}"] if run.cp > 1 else []
    words += [f"ep{run.ep}"] if run.ep > 1 else []
    words += [f"v{run.vp}" if run.vp else "v?", f"mbs {run.mbs}" if run.mbs else "mbs ?"]
    modules = f" ({'+'.join(run.recompute_modules)})" if run.recompute_modules else ""
    words += [f"{run.global_batch}x{run.seq}", f"recompute {run.recompute}{modules}", run.sharding]
    words += ["sp"] if run.sequence_parallel else []
    return ", ".join(words)


def _figure(run: Run, value: float) -> str:
    text = f"{value:.2f}" if run.unit == STEP else f"{value:.0f}" if run.unit == TOKENS else f"{value:.1f}"
    return f"{text} {run.unit}"


def _free(free: Plan | None, pinned: Pinning) -> str:
    if free is None:
        return "none fits | -"
    recomputed = sum(s.recompute for s in free.stages)
    what = f"t{free.tensor_parallel} p{free.devices} d{free.data_parallel}"
    what += f" cp{free.context_parallel}" if free.context_parallel > 1 else ""
    what += f" ep{free.expert_parallel}" if free.expert_parallel > 1 else ""
    what += " (all-to-all hidden)" if free.overlap.expert_comm else ""
    what += f", {free.schedule} v{free.virtual}"
    ratio = f"{free.step_time_s / pinned.plan.step_time_s:.2f}" + ("" if pinned.fits else " (pinned over memory)")
    return f"{what}, m {free.micro_batches}, {recomputed} of {len(free.stages)} recompute | {ratio}"


def _sources(runs: list[Run]) -> None:
    for run in runs:
        print(f"{run.name}: {run.source}")
        for label, text in (("unpublished", run.unpublished), ("unverified", run.unverified)):
            if text:
                print(f"  {label}: {text}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="", help="run names or name prefixes, comma-separated (default: all)")
    ap.add_argument("--no-free", action="store_true", help="skip the free searches")
    ap.add_argument("--write-plans", metavar="DIR", help="write each pinned plan as DIR/NAME.json")
    ap.add_argument("--sources", action="store_true", help="print each row's source and what it does not say, and stop")
    ap.add_argument("--deepseek-h800", action="store_true", help="DeepSeek-V3 on 2,048 H800s: pinned against free")
    args = ap.parse_args()
    if args.deepseek_h800:
        return deepseek_h800(not args.no_free)
    wanted = [w.strip() for w in args.rows.split(",") if w.strip()]
    runs = [r for r in RUNS if not wanted or any(r.name == w or r.name.startswith(w) for w in wanted)]
    if not runs:
        print(f"bench_published: no run matches --rows {args.rows!r}", file=sys.stderr)
        return 2
    if args.sources:
        _sources(runs)
        return 0
    if hasattr(os, "sched_setaffinity"):  # one core
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    out = Path(args.write_plans) if args.write_plans else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    t0 = time.process_time()
    specs, lines = calibrated(runs)
    print("\n".join(lines))
    print(
        "\n| run | GPUs, device, dtype | inter-node link | published layout | published | predicted (pinned) | error "
        "| role, FLOPs | peak memory, pinned | free search: t p d, schedule, m, recompute | free / pinned step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    held: dict[tuple[str, str], list[float]] = {}
    over: list[str] = []
    for run in runs:
        spec = specs[run.family]
        pin = plan_pinned(run, spec)
        value = predicted_figure(run, pin.plan)
        err = error(run, value)
        role = (
            "calibration"
            if CALIBRATION.get(run.family) == run.name
            else "held out"
            if run.verified
            else "not verified (out of the statistics)"
        )
        if role == "held out":
            held.setdefault(run.family, []).append(err)
        memory = f"{format_bytes(pin.needs)} of {format_bytes(spec.memory_bytes)}"
        if not pin.fits:
            memory = f"**needs {format_bytes(pin.needs)} > {format_bytes(spec.memory_bytes)}**"
            over.append(run.name)
        free = plan_free(run, spec, layout_choices(run).shard_optimizer) if not args.no_free else None
        free_cell = _free(free, pin) if not args.no_free else "- | -"
        convention = (
            f"{run.flops} FLOPs" if run.unit == TFLOPS else f"{run.unit} ({run.also})" if run.also else run.unit
        )
        print(
            f"| {run.name} | {run.gpus} {run.device} {run.dtype} | {LINKS[run.link].name} | {_layout(run)} "
            f"| {_figure(run, run.figure)} | {_figure(run, value)} | {err:+.1%} | {role}, {convention} | {memory} "
            f"| {free_cell} |",
            flush=True,
        )
        if out is not None:
            (out / f"{run.name}.json").write_text(pin.plan.to_json())
    print()
    for run in runs:
        if layout_choices(run).approximated:
            print(f"{run.name}: {'; '.join(layout_choices(run).approximated)}")
    for family, errs in sorted(held.items()):
        device, dtype = family
        print(f"{device} {dtype}: held out {len(errs)}, median |error| {_median(errs):.1%}, worst {_worst(errs):+.1%}")
    if over:
        print(f"pinned layouts that do not fit the device as predicted: {', '.join(over)}")
    else:
        print("every pinned published layout fits the device's memory as predicted")
    print(f"CPU {time.process_time() - t0:.1f} s")
    errs = [e for v in held.values() for e in v]
    print(f"held-out rows: {len(errs)}, median |error| {_median(errs):.1%}, worst {_worst(errs):+.1%}")
    return 0


DEEPSEEK_H800 = Run(
    name="deepseek-v3-h800-2048",
    model="moe",
    kwargs=(("preset", "deepseek-v3"),),
    device="h800",
    dtype="fp8",
    link="deepseek-ib",
    gpus=2048,
    t=1,
    p=16,
    d=128,
    vp=None,
    mbs=None,
    global_batch=15360,
    seq=4096,
    recompute="selective",
    sharding="zero1",
    sequence_parallel=False,
    figure=1.0,
    unit=STEP,
    flops="",
    source="DeepSeek-AI, DeepSeek-V3 Technical Report (arXiv 2412.19437), Sec. 3.1-3.2 and 4.2",
    unpublished="throughput; the micro-batch size",
    verified=False,
    ep=64,
)


def deepseek_h800(free_search: bool) -> int:
    """The published DeepSeek-V3 layout on 2,048 H800s, pinned (DualPipeV, ep 64, no t), against
    the free search's choice over t x cp x p x d x ep; the predicted gain, explained by the plans."""
    run, spec = DEEPSEEK_H800, device_spec("h800")
    cluster = cluster_of(run, spec)
    counts = counts_of(run)
    profile = profile_from_counts(counts, spec)
    share = DEEPSEEK_SMS / DEVICE_SMS["h800"]  # its all-to-all kernels' SMs beside the compute (Sec. 3.2.2)
    parallel = options_of(run, spec, False, dispatch_bytes=1.0, deduplicate=True, max_nodes=4, alltoall_share=share)
    tensor = tensor_options(counts, spec, cluster, sequence_parallel=False)
    t0 = time.process_time()
    pinned_request = ParallelRequest(
        cluster,
        run.global_batch,
        spec.memory_bytes,
        shard_optimizer=True,
        stages=run.p,
        choices=Choices(schedule="dualpipe-v"),
        tensor_parallel=1,
        data_parallel=run.d,
        expert_parallel=run.ep,
        expert_tensor_parallel=1,
    )
    pinned = plan_parallel(profile, pinned_request, None, tensor, parallel)
    print(f"pinned (PP 16 x EP 64, DualPipeV, ZeRO-1): {pinned.best.describe()}")
    print(f"  memory choice: {pinned.plan.memory_choice or 'none'}; CPU {time.process_time() - t0:.1f} s", flush=True)
    if not free_search:
        return 0
    free_request = ParallelRequest(cluster, run.global_batch, spec.memory_bytes, shard_optimizer=True)
    free = plan_parallel(profile, free_request, None, tensor, parallel)
    gain = pinned.plan.step_time_s / free.plan.step_time_s - 1
    print(f"free: {free.best.describe()}")
    second = free.runner_up.describe() if free.runner_up else "none"
    print(f"  memory choice: {free.plan.memory_choice or 'none'}; runner-up: {second}")
    cpu = time.process_time() - t0
    print(f"predicted gain of the free choice over the published layout: {gain:+.1%}; CPU {cpu:.1f} s")
    return 0


def _median(errs: list[float]) -> float:
    return statistics.median(abs(e) for e in errs) if errs else math.nan


def _worst(errs: list[float]) -> float:
    return max(errs, key=abs) if errs else math.nan


if __name__ == "__main__":
    sys.exit(main())
