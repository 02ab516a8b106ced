"""The programmatic entry points: profile, plan and emit a model from Python.

    import autopipe
    plan = autopipe.plan("models/gpt.py", kwargs={"n_layer": 8}, stages=2, batch_size=8, memory="1GiB")
    plan.save("plan.json")                         # autopipe run plan.json / autopipe emit plan.json

    plan = autopipe.plan(model, x, loss_fn=loss, example_targets=y, stages=4, batch_size=32)
    autopipe.emit(plan, model, "stages/", example_inputs=x)

The model is a **model file** (``"path/to/model.py[:factory]"`` with the factory's ``kwargs``,
loaded as ``autopipe plan`` loads it) or an **nn.Module** you hold, with ``example_inputs`` and
optionally ``example_targets`` and ``loss_fn`` (:mod:`autopipe.model.given`). A plan of a model
file records the file, factory and kwargs, so the command line rebuilds it; a plan of an
in-memory module names none (its recipe's ``model_file`` is ""): it runs and emits in Python.
What the user pins is one :class:`Choices`, what the hardware costs one :class:`Link`, taken
alike by :func:`plan`, :func:`plan_profile` and :func:`plan_cluster` (and the CLI, through here).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autopipe.config import check_layers, check_parts, megatron_args, torchtitan_parts
from autopipe.config.parts import model_parts
from autopipe.costs.analytic import ModelCounts, count_model, profile_from_counts
from autopipe.costs.calibrate import calibrate, save_calibration, stored_calibration
from autopipe.costs.devices import DeviceSpec, device_spec, read_cluster_file
from autopipe.costs.measure.match import check_profile_of, fingerprint_of
from autopipe.costs.measure.measured import Progress, profile_model
from autopipe.costs.options import Links, parallel_options
from autopipe.costs.profile import Profile
from autopipe.errors import AutopipeError, ConfigError, EmitError, InfeasibleError, PlanError
from autopipe.graph.recipe import TraceRecipe
from autopipe.model.given import (
    Batch,
    ModelArg,
    batch_of,
    check_samples,
    load_given,
    maker,
    source_of,
)
from autopipe.model.load import check_model_runs, load_model
from autopipe.model.spec import parse_kwargs
from autopipe.model.usercode import DEFAULT_LOAD_TIMEOUT_S, load_timeout
from autopipe.modes import Recompute, Sharding, Tracer
from autopipe.planner.assemble import plan_costs, plan_timeline
from autopipe.planner.balance import plan_balance
from autopipe.planner.cluster import check_degrees, cluster_fields, target_overlap, tensor_options
from autopipe.planner.defaults import (
    ANALYTIC_MICRO_BATCH_SIZES,
    default_dtype,
    default_micro_batch_sizes,
    host_shared,
    parallel_request,
    plan_micro_batch_sizes,
    plan_request,
    with_host_sharing,
)
from autopipe.planner.parallel import ParallelPlan, Rejected, plan_parallel
from autopipe.planner.request import (
    API_WORDS,
    CHOICE_FIELDS,
    LINK_FIELDS,
    TARGETS,
    Choices,
    Link,
    PlanRequest,
    Words,
    check_target,
    target_spec,
    validate,
)
from autopipe.planner.search import plan_pipeline
from autopipe.plans import FreePlan, Overlap, Plan
from autopipe.schedules.targets import SHARDINGS
from autopipe.stages.emit import emit as emit_rebuilt
from autopipe.stages.emit import emit_stages
from autopipe.stages.rebuild import rebuild_model
from autopipe.stages.whole import model_file_of
from autopipe.units import check_count, check_int, check_kind, check_path, parse_bytes

__all__ = [  # the functions, then what they take and give (the CLI imports these from here)
    "API_WORDS",
    "DEFAULT_LOAD_TIMEOUT_S",
    "SHARDINGS",
    "TARGETS",
    "Choices",
    "DeviceSpec",
    "FreePlan",
    "Link",
    "ModelCounts",
    "Overlap",
    "ParallelPlan",
    "Plan",
    "Profile",
    "Progress",
    "Recompute",
    "Rejected",
    "TraceRecipe",
    "Tracer",
    "Words",
    "calibrate",
    "catalogue_device",
    "check_config",
    "check_degrees",
    "check_profile_of",
    "count",
    "default_micro_batch_sizes",
    "emit",
    "executor_probe",
    "fingerprint_of",
    "load_timeout",
    "megatron_config",
    "parse_kwargs",
    "plan",
    "plan_cluster",
    "plan_costs",
    "plan_micro_batch_sizes",
    "plan_profile",
    "plan_timeline",
    "price",
    "profile",
    "read_cluster_file",
    "save_calibration",
    "search_cluster",
    "target_note",
    "target_spec",
]


def profile(
    model: ModelArg,
    example_inputs: Batch | None = None,
    *,
    kwargs: Mapping[str, object] | None = None,
    loss_fn: Callable[..., Any] | None = None,
    example_targets: Batch | None = None,
    micro_batch_sizes: Sequence[int] = (1, 2, 4),
    tracer: Tracer | str = Tracer.AUTO,
    leaf_modules: Sequence[str] = (),
    max_blocks: int | None = None,
    device: str = "cpu",
    warmup: int = 2,
    repeat: int = 5,
    threads: int | None = 1,
    progress: Progress | None = None,
) -> Profile:
    """Measure every block of ``model`` (a model file or an nn.Module; see ``autopipe profile``)
    on ``threads`` CPU threads (None: torch's setting), telling ``progress(what, done, total)``."""
    _check_profiling(micro_batch_sizes, max_blocks, warmup, repeat, threads)
    needed = max(micro_batch_sizes, default=1)
    check_samples("example_inputs", example_inputs, needed, "micro-batch size")
    check_samples("example_targets", example_targets, needed, "micro-batch size")
    said = model if isinstance(model, (str, os.PathLike)) else f"the {type(model).__name__} module"
    if progress is not None:
        progress(f"loading {os.fspath(said)}", 0, 0)
    loaded = load_given(model, example_inputs, kwargs, loss_fn, example_targets, device)
    if progress is not None:
        progress(f"checking that {os.fspath(said)} runs", 0, 0)
    check_model_runs(loaded, needed)
    recipe = TraceRecipe(tracer=tracer, leaf_modules=tuple(leaf_modules), max_blocks=max_blocks)
    prof = profile_model(
        loaded,
        micro_batch_sizes=micro_batch_sizes,
        recipe=recipe,
        warmup=warmup,
        repeat=repeat,
        device=device,
        progress=progress,
        threads=threads,
        executor=executor_probe,
    )
    if isinstance(model, nn.Module):  # nothing to rebuild it from: the recipe names no file
        prof = replace(prof, model=f"{type(model).__name__} (in memory)", recipe=replace(prof.recipe, model_file=""))
    return prof


def executor_probe() -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The executor's cost per action and per send to another rank, estimated per round on this
    host (``runtime/probe.py``), as ``profile_model(executor=...)`` takes them."""
    from autopipe.runtime.probe import measure_executor

    samples = measure_executor()
    return None if samples is None else (samples.action_s, samples.send_s)


def plan(
    model: ModelArg,
    example_inputs: Batch | None = None,
    *,
    kwargs: Mapping[str, object] | None = None,
    loss_fn: Callable[..., Any] | None = None,
    example_targets: Batch | None = None,
    devices: int | None = None,
    stages: int | None = None,
    memory: float | str | None = None,
    batch_size: int,
    choices: Choices | None = None,
    link: Link | None = None,
    balance: Sequence[int] | None = None,
    profile_data: Profile | None = None,
    **profile_options: Any,
) -> Plan:
    """Profile ``model`` (unless ``profile_data`` is given) and plan its pipeline.

    ``model`` is a model file (``"path/to/model.py[:factory]"`` with ``kwargs``) or an
    nn.Module with ``example_inputs`` (and optionally ``loss_fn``, ``example_targets``).
    ``devices`` (or ``stages``, the same) counts pipeline devices and ``memory`` is the limit
    per device; ``choices`` pins decisions, ``link`` prices the hardware; ``balance`` as
    :func:`plan_profile`. Left out, each takes ``autopipe plan``'s default
    (:mod:`autopipe.planner.defaults`), as do the micro-batch sizes profiled.
    """
    _check_profile_options(profile_options)
    devices, stages, batch_size = _check_request(API_WORDS, devices, stages, batch_size, choices, link, balance)
    prof = profile_data
    if prof is None:
        sizes = profile_options.pop("micro_batch_sizes", None)
        if sizes is None:
            given = [n for n in (batch_of(example_inputs), batch_of(example_targets)) if n is not None]
            sizes = plan_micro_batch_sizes(batch_size, min(given) if given else None)
        prof = profile(
            model,
            example_inputs,
            kwargs=kwargs,
            loss_fn=loss_fn,
            example_targets=example_targets,
            micro_batch_sizes=sizes,
            **profile_options,
        )
    return plan_profile(
        prof,
        devices=devices,
        stages=stages,
        batch_size=batch_size,
        memory=memory,
        choices=choices,
        link=link,
        balance=balance,
    )


def target_note(plan: Plan, words: Words = API_WORDS) -> str:
    """Both predictions of a plan made for a target that searches less (``plan.free_plan``; ``""``
    for another plan): ``free plan (any schedule): v-half, 8 micro-batches, 1.23 s/iter;
    --target megatron (Megatron-LM): interleaved-1f1b v=2, 8 micro-batches, 1.31 s/iter (+6.5%)``."""
    free = plan.free_plan
    if free is None:
        return ""
    cluster = plan.data_parallel > 1 or plan.tensor_parallel > 1 or free.data_parallel > 1 or free.tensor_parallel > 1
    mine, theirs = (plan.step_time_s, free.step_time_s) if cluster else (plan.iteration_time_s, free.iteration_time_s)
    unit = "s/step" if cluster else "s/iter"
    extra = mine / theirs - 1 if theirs > 0 else 0.0
    return (
        f"free plan (any schedule): {_decided(free, cluster)}, "
        f"{theirs:.3g} {unit}; {words.said('target', plan.target)} ({target_spec(plan.target).label}): "
        f"{_decided(FreePlan.of(plan), cluster)}, {mine:.3g} {unit} ({extra:+.1%})"
    )


def _decided(plan: FreePlan, cluster: bool) -> str:
    """``interleaved-1f1b v=2, 8 micro-batches, recomputing every stage`` (``t=2 x S=4 x D=2, `` first
    for a --gpus plan)."""
    stages = plan.devices * plan.virtual
    rc = plan.recomputed
    said = "every stage" if len(rc) == stages else "stage(s) " + ",".join(map(str, rc))
    return (
        (f"t={plan.tensor_parallel} x S={plan.devices} x D={plan.data_parallel}, " if cluster else "")
        + plan.schedule
        + (f" v={plan.virtual}" if plan.virtual > 1 else "")
        + f", {plan.micro_batches} micro-batches"
        + (f", recomputing {said}" if rc else "")
        + (f", {plan.memory} in every layer" if plan.memory else "")
    )


def _with_free(plan: Plan, free: Callable[[], Plan]) -> Plan:
    """``plan`` with the free plan's prediction (``free()``: the same request, target autopipe)
    where its target searches less than autopipe; as it is where the free search finds nothing."""
    if not target_spec(plan.target).restricts():
        return plan
    try:
        return replace(plan, free_plan=FreePlan.of(free()))
    except InfeasibleError:
        return plan


def _check_profile_options(options: Mapping[str, object]) -> None:
    """One line for a choice or link keyword passed loose (``micro_batches=4``), not in its value."""
    for name in options:
        if name in CHOICE_FIELDS:
            raise PlanError(
                f"{name} is one of the plan's choices: pass choices=Choices({name}=...) (autopipe.api.Choices)"
            )
        if name in LINK_FIELDS or name.startswith("link_"):
            raise PlanError(
                f"{name} describes the link: pass link=Link(...) "
                "(autopipe.api.Link: bandwidth, latency_s, action_overhead_s, send_overhead_s)"
            )


def _check_profiling(sizes: object, max_blocks: object, warmup: object, repeat: object, threads: object) -> None:
    """The profiling arguments' types and ranges, before the model is loaded (as the CLI checks its flags)."""
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or not sizes:
        raise PlanError(
            f"micro_batch_sizes must be a sequence of positive integers, like (1, 2, 4) (got {sizes!r:.60})"
        )
    for u in sizes:
        check_int(u, "micro_batch_sizes entries")
    if max_blocks is not None:
        check_int(max_blocks, "max_blocks")
    for field, value in (("warmup", warmup), ("repeat", repeat), ("threads", threads)):
        if value is not None or field != "threads":
            check_count(value, field)


def _check_request(
    words: Words,
    devices: object,
    stages: object,
    batch_size: object,
    choices: object,
    link: object,
    balance: object,
) -> tuple[int | None, int | None, int]:
    """One line for an argument of the wrong type (``stages="2"``, ``batch_size=8.0``, ``link={}``),
    named as ``words`` says; the ranges are :func:`validate`'s. Returns devices, stages and
    batch_size as ints (a numpy integer taken as its value)."""
    counts = [
        None if v is None else check_int(v, words.name(f), ranged=False)
        for f, v in (("devices", devices), ("stages", stages))
    ]
    batch = check_int(batch_size, words.name("batch_size"), ranged=False)
    if choices is not None:
        check_kind(choices, Choices, "choices", "a Choices, like Choices(micro_batches=8, schedule='1f1b')", PlanError)
    if link is not None:
        check_kind(link, Link, "link", "a Link, like Link(bandwidth=25e9, latency_s=20e-6)", PlanError)
    return counts[0], counts[1], batch


def _devices(devices: int | None, stages: int | None, words: Words) -> int | None:
    """``devices`` and ``stages`` are one thing (pipeline devices): either, or both equal."""
    if devices is not None and stages is not None and devices != stages:
        raise PlanError(
            f"{words.name('devices')} and {words.name('stages')} are the same thing (pipeline devices); give one"
        )
    return devices if devices is not None else stages


def plan_profile(
    profile: Profile | str | os.PathLike[str],
    *,
    devices: int | None = None,
    stages: int | None = None,
    batch_size: int,
    memory: float | str | None = None,
    choices: Choices | None = None,
    link: Link | None = None,
    balance: Sequence[int] | None = None,
    device: DeviceSpec | None = None,
    progress: Progress | None = None,
    words: Words = API_WORDS,
) -> Plan:
    """Plan from a saved Profile (or the path of its JSON), as ``autopipe plan --profile``.

    Without ``balance`` it searches; with ``balance`` (blocks per chunk in chunk order: S
    entries for one-chunk schedules, S·v for interleaved and V schedules, which then need
    ``choices.schedule``; S entries and no schedule try the one-chunk schedules only) the plan
    is that split, priced by the same function the search prices every split with, and
    autopipe's best for the same request is its first baseline, named ``autopipe``.
    ``device`` is the catalogue device an analytic profile was priced for (its memory and
    links are the defaults); ``words`` says how errors name the fields (the CLI: its flags).
    """
    devices, stages, batch_size = _check_request(words, devices, stages, batch_size, choices, link, balance)
    if isinstance(profile, (str, os.PathLike)):
        prof = Profile.load(Path(profile))
    elif isinstance(profile, Profile):
        prof = profile
    else:
        raise PlanError(f"profile must be a Profile or the path of a profile JSON, not a {type(profile).__name__}")
    request = plan_request(
        prof,
        devices=_devices(devices, stages, words),
        batch_size=batch_size,
        memory_limit=None if memory is None else parse_bytes(memory, words.name("memory")),
        choices=choices or Choices(),
        link=link or Link(),
        device=device,
    )
    validate(prof, request, words)
    prof, request, sharing, sharing_spread = host_shared(prof, request)

    def planned(req: PlanRequest) -> Plan:
        if balance is None:
            plan = plan_pipeline(prof, req, progress)
        else:
            plan = plan_balance(prof, req, balance, flag=words.name("balance"))
        return with_host_sharing(plan, sharing, sharing_spread)

    return _with_free(planned(request), lambda: planned(replace(request, target="autopipe")))


def emit(
    plan: Plan,
    model: nn.Module | None,
    folder: str | Path,
    *,
    example_inputs: Batch | None = None,
    force: bool = False,
    weights: bool = True,
    weights_format: str = "pt",
) -> dict[str, Any]:
    """Write ``plan``'s stages as standalone folders into ``folder`` (as ``autopipe emit``);
    returns the manifest.

    ``model`` is the nn.Module the plan was made for, split with its own weights; it needs
    ``example_inputs`` (one batch, or a function batch_size -> inputs) to trace it at the
    plan's micro-batch size. ``model=None`` rebuilds the plan's model from its model file,
    as ``autopipe emit`` does (seeded weights).
    """
    check_kind(plan, Plan, "plan", "a Plan (autopipe.Plan.load(path))", EmitError)
    dest = check_path(folder, "folder", "the folder to write the stages into", error=EmitError)
    if not force and dest.is_dir() and any(dest.iterdir()):  # as check_destination, in this API's words
        raise EmitError(f"{dest} is not empty; emit into a new folder or pass force=True to replace it")
    if model is None:
        if example_inputs is not None:
            raise PlanError(
                "example_inputs come from the plan's model file when model is None; drop them, or pass the nn.Module"
            )
        return emit_rebuilt(plan, folder, force=force, weights=weights, weights_format=weights_format)
    if not isinstance(model, nn.Module):
        raise PlanError(
            "model must be the nn.Module the plan was made for (or None: rebuild it from its model file), "
            f"not a {type(model).__name__}"
        )
    if example_inputs is None:
        raise PlanError(
            f"emitting the {type(model).__name__} module needs example_inputs (one batch, "
            "or a function batch_size -> inputs) "
            f"to trace it at the plan's micro-batch size {plan.micro_batch_size}"
        )
    if weights and any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        raise PlanError(
            f"the {type(model).__name__} module is on the meta device, so it has no weights to write; "
            "pass weights=False"
        )
    check_samples("example_inputs", example_inputs, plan.micro_batch_size, "the plan's micro-batch size")
    inputs = maker(example_inputs)(plan.micro_batch_size)
    return emit_stages(
        plan,
        model,
        inputs,
        folder,
        force=force,
        weights=weights,
        weights_format=weights_format,
        source=source_of(model),
        model_file=model_file_of(plan),  # where a stage builds a module it keeps whole
    )


def catalogue_device(
    name: str, device_files: Sequence[str | Path] = (), calibration: str | Path | None = None
) -> DeviceSpec:
    """The catalogue device ``name`` (``h100``, ``cpu``, ...; or ``device_files``' own), with its
    stored calibration (or the one in ``calibration``)."""
    return stored_calibration(device_spec(name, device_files), calibration)


def count(
    model: str | os.PathLike[str],
    kwargs: Mapping[str, object] | None,
    spec: DeviceSpec,
    *,
    micro_batch_sizes: Sequence[int] | None = None,
    dtype: str | None = None,
    recipe: TraceRecipe | None = None,
    progress: Progress | None = None,
) -> ModelCounts:
    """``model`` (a model file, ``path.py[:factory]``, with ``kwargs``) built on meta and counted
    for an analytic plan on ``spec`` (a deep stack of identical layers counted as a shallow copy,
    exactly); defaults: the analytic micro-batch sizes and the device's training precision."""
    if progress is not None:
        progress(f"loading {os.fspath(model)} on the meta device", 0, 0)
    loaded = load_model(model, kwargs, device="meta")  # type: ignore[arg-type]  # a Path too: ModelSpec.parse
    return count_model(
        loaded,
        micro_batch_sizes=tuple(micro_batch_sizes or ANALYTIC_MICRO_BATCH_SIZES),
        dtype=dtype or default_dtype(spec),
        recipe=recipe or TraceRecipe(),
        progress=progress,
        shallow=True,
    )


def price(counts: ModelCounts, spec: DeviceSpec) -> Profile:
    """The analytic profile of ``counts`` on one ``spec`` device (no tensor parallelism)."""
    return profile_from_counts(counts, spec)


def search_cluster(
    profile: Profile,
    *,
    gpus: int,
    batch_size: int,
    memory: float | str | None = None,
    tensor_parallel: int | None = None,
    stages: int | None = None,
    data_parallel: int | None = None,
    choices: Choices | None = None,
    link: Link | None = None,
    zero1: bool = False,
    sequence_parallel: bool = True,
    cluster: Mapping[str, float] | str | os.PathLike[str] | None = None,
    device: DeviceSpec | None = None,
    counts: ModelCounts | None = None,
    device_files: Sequence[str | Path] = (),
    progress: Progress | None = None,
    words: Words = API_WORDS,
    sharding: str | None = None,
    shard_group: int | None = None,
    overlap: Overlap | str | None = None,
    context_parallel: int | None = None,
    expert_parallel: int | None = None,
    expert_tensor_parallel: int | None = None,
) -> ParallelPlan:
    """The tensor x pipeline x data search over ``gpus`` devices for ``profile`` (``--gpus``):
    the best layout, its sharding, its runner-up and the splits with no plan. ``stages`` pins
    the pipeline depth; tensor parallelism is searched when ``counts`` and ``device`` (what
    ``profile`` was priced from) are given, else ``t = 1``. ``sharding`` pins how the state is
    split over the replicas (``none``, ``zero1``, ``zero2``, ``zero3``, ``zero3-step``; ``zero1=True``
    is ``sharding="zero1"``), ``shard_group`` over how many of them (hybrid); ``overlap`` what the
    time model overlaps (an :class:`~autopipe.plans.Overlap` or its text; None: the target's).
    ``context_parallel``, ``expert_parallel`` and ``expert_tensor_parallel`` pin cp, ep and etp
    (searched where the model has attention over a long sequence, or routed experts:
    ``planner.cluster.experts``); the profile is then priced per degrees (``costs.options``)."""
    gpus = check_int(gpus, words.name("gpus"), ranged=False)
    batch_size = check_int(batch_size, words.name("batch_size"), ranged=False)
    pins = {"context_parallel": context_parallel, "expert_parallel": expert_parallel}
    pins["expert_tensor_parallel"] = expert_tensor_parallel
    _check_pins(gpus, words, tensor_parallel, stages, data_parallel, pins, counts is not None and device is not None)
    fields = cluster_fields(cluster)
    check_target(choices or Choices(), words)
    pinned, group = _sharding(sharding, shard_group, zero1, words)
    overlaps = target_overlap((choices or Choices()).target, _overlap(overlap, words))
    request = parallel_request(
        profile,
        gpus=gpus,
        stages=stages,
        batch_size=batch_size,
        memory_limit=None if memory is None else parse_bytes(memory, words.name("memory")),
        choices=choices or Choices(),
        link=link or Link(),
        device=device,
        device_files=device_files,
        sharding=pinned,
        shard_group=group,
        overlap=overlaps,
    )
    layout = replace(request.cluster, **fields)  # type: ignore[arg-type]
    request = replace(
        request,
        cluster=layout,
        tensor_parallel=tensor_parallel,
        data_parallel=data_parallel,
        context_parallel=context_parallel,
        expert_parallel=expert_parallel,
        expert_tensor_parallel=expert_tensor_parallel,
    )
    tensor, parallel = None, None
    if counts is not None and device is not None:
        tensor = tensor_options(counts, device, layout, sequence_parallel, overlaps.tp_comm)
        links = Links.of(layout)
        parallel = parallel_options(
            counts, device, links, sequence_parallel=sequence_parallel, tensor_overlap=overlaps.tp_comm
        )
    result = plan_parallel(profile, request, progress, tensor, parallel)
    free = replace(request, choices=replace(request.choices, target="autopipe"))
    plan = _with_free(result.plan, lambda: plan_parallel(profile, free, progress, tensor, parallel).plan)
    return replace(result, best=replace(result.best, plan=plan))


def _check_pins(
    gpus: int,
    words: Words,
    tensor_parallel: int | None,
    stages: int | None,
    data_parallel: int | None,
    pins: Mapping[str, int | None],
    analytic: bool = True,
) -> None:
    """The pinned degrees against ``gpus`` (``check_degrees``, named as ``words`` says); cp, ep
    and etp, which only an analytic plan prices, refused without one."""
    degrees = [("tensor_parallel", tensor_parallel), ("stages", stages), ("data_parallel", data_parallel)]
    degrees.append(("context_parallel", pins["context_parallel"]))
    others = [(words.name(k), pins[k]) for k in ("expert_parallel", "expert_tensor_parallel")]
    check_degrees(gpus, [(words.name(k), v) for k, v in degrees], words.name("gpus"), others)
    if not analytic and any((v or 1) > 1 for v in pins.values()):
        said = ", ".join(words.name(k) for k in pins)
        raise PlanError(f"{said} need an analytic plan (a model file and a device)")


def _sharding(sharding: object, shard_group: object, zero1: bool, words: Words) -> tuple[Sharding | None, int | None]:
    """The pinned sharding and shard group, checked (``zero1=True``: ZeRO-1's older name)."""
    if sharding is not None and sharding not in SHARDINGS:
        raise PlanError(f"{words.name('sharding')} {sharding!r:.40}: use one of {', '.join(SHARDINGS)}")
    if zero1 and sharding not in (None, "zero1"):
        raise PlanError(f"{words.name('zero1')} and {words.said('sharding', sharding)} contradict each other; give one")
    group = None if shard_group is None else check_int(shard_group, words.name("shard_group"), ranged=False)
    if group is not None and group < 2:
        raise PlanError(f"{words.said('shard_group', group)}: shard over 2 or more replicas (or leave it out)")
    if group is not None and sharding in (None, "none") and not zero1:
        raise PlanError(
            f"{words.name('shard_group')} splits a sharding over fewer replicas; give {words.name('sharding')} too"
        )
    return (Sharding(sharding) if sharding is not None else Sharding.ZERO1 if zero1 else None), group


def _overlap(overlap: object, words: Words) -> Overlap | None:
    if overlap is None or isinstance(overlap, Overlap):
        return overlap
    return Overlap.parse(overlap, words.name("overlap"))  # type: ignore[arg-type]


def plan_cluster(
    model: str | os.PathLike[str],
    *,
    device: str,
    gpus: int,
    batch_size: int,
    kwargs: Mapping[str, object] | None = None,
    memory: float | str | None = None,
    tensor_parallel: int | None = None,
    stages: int | None = None,
    data_parallel: int | None = None,
    choices: Choices | None = None,
    link: Link | None = None,
    zero1: bool = False,
    sequence_parallel: bool = True,
    cluster: Mapping[str, float] | str | os.PathLike[str] | None = None,
    dtype: str | None = None,
    device_files: Sequence[str | Path] = (),
    calibration: str | Path | None = None,
    progress: Progress | None = None,
    sharding: str | None = None,
    shard_group: int | None = None,
    overlap: Overlap | str | None = None,
    context_parallel: int | None = None,
    expert_parallel: int | None = None,
    expert_tensor_parallel: int | None = None,
) -> Plan:
    """The plan ``autopipe plan MODEL --device DEVICE --gpus GPUS ...`` writes (same search, same
    plan), without allocating the model's weights: ``device`` a catalogue name (``h100``,
    ``a100-80gb``, ...), ``memory`` per device (default: the device's), ``batch_size`` the global
    batch, ``stages`` the pipeline depth; ``cluster`` overrides the device's nodes and links (a
    ``--cluster`` JSON file, or its fields as a mapping). PlanError (one line) for pinned
    degrees that cannot split ``gpus`` or a request nothing fits; ``context_parallel``,
    ``expert_parallel`` and ``expert_tensor_parallel`` pin cp, ep and etp (else searched)."""
    gpus = check_int(gpus, "gpus", ranged=False)
    batch_size = check_int(batch_size, "batch_size", ranged=False)
    check_degrees(
        gpus,
        [
            ("tensor_parallel", tensor_parallel),
            ("stages", stages),
            ("data_parallel", data_parallel),
            ("context_parallel", context_parallel),
        ],
        others=[("expert_parallel", expert_parallel), ("expert_tensor_parallel", expert_tensor_parallel)],
    )
    cluster_fields(cluster)  # a bad cluster is one line before any counting
    _sharding(sharding, shard_group, zero1, API_WORDS)
    _overlap(overlap, API_WORDS)
    spec = catalogue_device(device, device_files, calibration)
    counts = count(model, kwargs, spec, dtype=dtype, progress=progress)
    return search_cluster(
        price(counts, spec),
        gpus=gpus,
        batch_size=batch_size,
        memory=memory,
        tensor_parallel=tensor_parallel,
        stages=stages,
        data_parallel=data_parallel,
        choices=choices,
        link=link,
        zero1=zero1,
        sequence_parallel=sequence_parallel,
        cluster=cluster,
        device=spec,
        counts=counts,
        device_files=device_files,
        progress=progress,
        sharding=sharding,
        shard_group=shard_group,
        overlap=overlap,
        context_parallel=context_parallel,
        expert_parallel=expert_parallel,
        expert_tensor_parallel=expert_tensor_parallel,
    ).plan


def megatron_config(plan: Plan, *, base: str | Path | None = None, **options: Any) -> str:
    """The plan as Megatron-LM arguments (:func:`autopipe.config.megatron_args`, ``options`` its
    keywords), its model rebuilt on the meta device to count its layers and read its definition;
    a model that cannot be rebuilt leaves the block names to count and a ``#`` line saying why.
    The GPUs per node of the launch line are the catalogue device's the plan was counted on."""
    check_kind(plan, Plan, "plan", "a Plan (autopipe.Plan.load(path))", ConfigError)
    per_node = None
    if "(analytic" in plan.profile_device:  # "h100: NVIDIA H100 SXM5 80GB (analytic, bf16)": a catalogue device
        try:
            per_node = device_spec(plan.profile_device.split(":")[0]).devices_per_node
        except AutopipeError:
            per_node = None  # a device of a --device-file the plan does not name
    options.setdefault("devices_per_node", per_node)
    try:
        loaded = rebuild_model(plan, meta=True, base=base)
        example = loaded.make_inputs(1)
    except AutopipeError as e:
        return megatron_args(plan, unbuilt=str(e), **options)
    if isinstance(example, Mapping):
        example = example.get("input_ids")
    seq = None
    if isinstance(example, torch.Tensor) and example.dim() == 2 and not example.is_floating_point():
        seq = int(example.shape[1])  # (batch, sequence) token ids; not an MLP's (batch, features)
    return megatron_args(plan, model=loaded.model, seq_length=seq, **options)


CONFIG_TARGETS = ("megatron", "torchtitan", "torchtitan-main", "torchtitan-0.2")
"""The frameworks :func:`check_config` (and ``autopipe config --for``) knows."""


def check_config(
    plan: Plan,
    model: str | os.PathLike[str],
    *,
    kwargs: Mapping[str, object] | None = None,
    target: str = "torchtitan",
    base: str | Path | None = None,
) -> None:
    """Check the plan's ``target`` config against the model the user will train: ``model`` (a model
    file, ``path/to/model.py[:factory]``, with its factory's ``kwargs``) built on the meta device.

    torchtitan (either version): every name of ``module_fqns_per_model_part`` is a module of the
    model and the parts cover it (:func:`autopipe.config.check_parts`); Megatron-LM: the plan's
    layer list is a module of the model with ``--num-layers`` layers, counted as
    :func:`megatron_config` counts them (``base`` as there). Returns nothing; ConfigError (one
    line, starting with ``model``) when the config does not fit it."""
    check_kind(plan, Plan, "plan", "a Plan (autopipe.Plan.load(path))", ConfigError)
    if target not in CONFIG_TARGETS:
        raise ConfigError(f"target {target!r} is not a framework autopipe writes for; use one of {CONFIG_TARGETS}")
    source = os.fspath(check_path(model, "model", "a model file, path/to/model.py[:factory]", error=ConfigError))
    built = load_model(source, kwargs, device="meta").model
    if target != "megatron":
        check_parts(torchtitan_parts(plan), built, source)
        return
    container = model_parts(plan).container
    try:
        planned: int | None = len(
            list(rebuild_model(plan, meta=True, base=base).model.get_submodule(container).children())
        )
    except (AutopipeError, AttributeError, TypeError):
        planned = None  # as megatron_config: the layers the block names show
    check_layers(container, model_parts(plan, planned).num_layers, built, source)
