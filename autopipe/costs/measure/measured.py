"""Measure what each block of a model costs: time, saved activations, parameters, edges.

For each micro-batch size the model is traced (``graph/trace.py``), every block is cut out as its
own module (``graph/segment.py``) and run on the values the blocks before it produced:

- forward and backward time: warm-up runs, then the median of ``repeat`` timed runs — CUDA
  events with synchronisation on a GPU, ``time.perf_counter`` on the CPU. Forwards are timed
  as in training: each run is a whole forward, block after block on what the blocks before
  made, keeping everything it made (and its graph) alive until the run ends;
- backward whole (one ``torch.autograd.backward``), and split into input-gradient and
  weight-gradient parts, the B and W of zero-bubble schedules, timed by the executor's own
  split (``runtime.zerobubble``) — which costs more than a whole backward;
- the training loss (the model file's ``loss_fn``), which the executor computes on the last
  stage: its time and saved bytes count in the last block;
- bytes saved for backward, counted exactly with ``torch.autograd.graph.saved_tensors_hooks``:
  every saved tensor's storage once, parameters excluded (they are counted as parameters);
- parameter bytes of the parameters each block owns, and bytes of every tensor on every edge.

Times and bytes are then fitted as affine functions of the micro-batch size (``costs.Affine``)
so the planner can price any micro-batch count. On the CPU the profile also measures how ranks
sharing the host slow each other (``costs.measure.contention``) and, where the caller gives the probe
(``api.py``: ``runtime/probe.py``, the executor's own pieces), the executor's cost per action and
per send to another rank (:func:`executor_cost`, ``Profile.executor``).
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from autopipe.costs.activations.anatomy import Anatomy, layer_anatomies, options_of
from autopipe.costs.counting import OpCount, block_time
from autopipe.costs.devices import DeviceSpec, device_spec, match_device, measure_cpu
from autopipe.costs.measure.contention import Probe
from autopipe.costs.measure.timing import (
    BlockMeasurement,
    measure_blocks,
    relative_spread,
    saved_bytes,
    storage_key,
    time_call,
)
from autopipe.costs.profile import Affine, BlockCost, ExecutorCost, Profile, Spread, TensorCost
from autopipe.errors import ProfileError
from autopipe.graph.outputs import training_loss
from autopipe.graph.recipe import DEFAULT_RECIPE, TraceRecipe
from autopipe.graph.trace import Block, TracedModel, trace_model
from autopipe.model.usercode import guarded
from autopipe.units import check_count

__all__ = [
    "BlockMeasurement",
    "ExecutorProbe",
    "Progress",
    "crossing_tensors",
    "executor_cost",
    "measure_blocks",
    "profile_model",
    "saved_bytes",
    "storage_key",
    "time_call",
]

Progress = Callable[[str, int, int], None]  # progress(what, done, total); total 0: not known
# The executor's probe (runtime/probe.py, passed in by api.py): per round, an estimate of its cost
# per action and one of its cost per send to another rank, in seconds; None where it could not run.
ExecutorProbe = Callable[[], tuple[Sequence[float], Sequence[float]] | None]
_ZERO = Affine(0.0, 0.0)
_NO_SPREAD = Spread()
CONTENTION_ROUNDS = (1, 2)  # rounds of the host-sharing probe before and after the blocks are timed


def profile_model(
    loaded: Any,
    *,
    micro_batch_sizes: Sequence[int],
    recipe: TraceRecipe = DEFAULT_RECIPE,
    warmup: int = 2,
    repeat: int = 5,
    device: str = "cpu",
    progress: Progress | None = None,
    threads: int | None = 1,
    contention: bool = True,
    executor: ExecutorProbe | None = None,
) -> Profile:
    """Trace and measure ``loaded`` (a ``load.LoadedModel``) at each micro-batch size.

    ``recipe`` says how to trace (tracer, leaf modules, block limit); the profile's recipe adds
    ``loaded``'s model file, factory and kwargs, the tracer that worked and the fingerprint.
    On the CPU the blocks run on ``threads`` threads (default 1: each pipeline rank of
    ``autopipe run`` runs on one thread, so that is what its stages will cost); ``None``
    keeps torch's current setting. ``contention``: on the CPU, also measure how ranks sharing this
    host slow each other (:mod:`autopipe.costs.measure.contention`), which the planner prices.
    ``executor``: on the CPU, the probe of the executor's own costs, run after the blocks on the
    same threads (:func:`executor_cost`; ``api.profile`` passes ``runtime/probe.py``'s).
    """
    for field, value in (("warmup", warmup), ("repeat", repeat), ("threads", threads)):
        if value is not None:
            check_count(value, field, error=ProfileError)
    before = torch.get_num_threads()
    if threads is not None and not device.startswith("cuda"):
        torch.set_num_threads(threads)
    try:
        with guarded("the model's forward (profiling)", loaded.spec.path, timed=False):
            cpu = not device.startswith("cuda")
            probe = Probe(threads=torch.get_num_threads()) if contention and cpu else None
            if probe is None:
                prof = _profile(loaded, micro_batch_sizes, recipe, warmup, repeat, device, progress)
            else:
                with probe:  # its workers start while the model is traced
                    prof = _profile(loaded, micro_batch_sizes, recipe, warmup, repeat, device, progress, probe)
                    probe.measure(CONTENTION_ROUNDS[1])
                prof = replace(prof, contention=probe.result())
        if executor is not None and cpu:
            if progress is not None:
                progress("the executor's cost per action and per send", 0, 0)
            prof = replace(prof, executor=executor_cost(executor()))
        return prof
    finally:
        torch.set_num_threads(before)


def executor_cost(samples: tuple[Sequence[float], Sequence[float]] | None) -> ExecutorCost:
    """The probe's per-round estimates (cost per action, cost per send) as the profile keeps
    them: medians and their relative spreads (:func:`~autopipe.costs.measure.timing.relative_spread`);
    not measured (falsy) where the probe gave none."""
    if samples is None or not samples[0] or not samples[1]:
        return ExecutorCost()
    action, send = samples
    return ExecutorCost(
        action_s=float(statistics.median(action)),
        send_s=float(statistics.median(send)),
        action_spread=relative_spread(action),
        send_spread=relative_spread(send),
        measured=True,
    )


def _profile(
    loaded: Any,
    micro_batch_sizes: Sequence[int],
    recipe: TraceRecipe,
    warmup: int,
    repeat: int,
    device: str,
    progress: Progress | None,
    probe: Probe | None = None,
) -> Profile:
    sizes = sorted(set(micro_batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ProfileError(f"micro-batch sizes must be positive integers (got {list(micro_batch_sizes)})")
    dev = _device(device)
    model: nn.Module = loaded.model.to(dev)
    model.train()
    traces: list[TracedModel] = []
    measured: list[list[BlockMeasurement]] = []
    anatomies: list[tuple[Anatomy | None, ...]] = []
    load = [_load_average()]
    for u in list(sizes):
        if progress is not None:
            progress(f"tracing at micro-batch size {u}", 0, 0)
        inputs = _to_device(loaded.make_inputs(u), dev)
        traced = trace_model(
            model,
            inputs,
            micro_batch_size=u,
            recipe=replace(recipe, tracer=traces[0].tracer) if traces else recipe,
            source=loaded.spec.path,
        )
        if drop_export_one(traced, sizes):
            continue
        if traces and [b.nodes for b in traced.blocks] != [b.nodes for b in traces[0].blocks]:
            raise ProfileError(
                f"the model's graph changes with the micro-batch size ({sizes[0]} vs {u}); "
                "profile one micro-batch size with --micro-batch-sizes N"
            )
        traces.append(traced)

        def report(done: int, total: int, k: int = len(traces) - 1, u: int = u) -> None:
            if progress is not None:
                progress(f"micro-batch {u}", k * total + done, total * len(sizes))

        targets = _to_device(loaded.make_targets(u), dev) if loaded.make_targets is not None else None
        loss = training_loss(loaded, traced, model, inputs, targets)
        if probe is not None and not measured:  # the host's sharing, before the first block is timed
            probe.measure(CONTENTION_ROUNDS[0])
        measured.append(measure_blocks(traced, inputs, warmup=warmup, repeat=repeat, progress=report, loss=loss))
        anatomies.append(layer_anatomies(traced, model, inputs))
    load.append(_load_average())
    profile = _make_profile(loaded, traces, measured, sizes, dev, recipe)
    profile = with_options(profile, anatomies, measured, dev)
    return replace(profile, load_average=tuple(x for x in load if x is not None))


def with_options(
    profile: Profile,
    anatomies: Sequence[Sequence[Anatomy | None]],
    measured: Sequence[Sequence[BlockMeasurement]],
    dev: torch.device,
) -> Profile:
    """``profile`` with each layer's memory options (``costs.activations.anatomy.options_of``): the bytes as
    counted (the same ``saved_tensors_hooks`` storages as measured), and a recomputed part's time
    as its counted ops' share of the layer's measured forward, the share priced by a roofline of
    ``dev`` (the catalogue GPU it is, or this CPU measured: ``devices.measure_cpu``). Not measured
    per part: a part's kernels are too short to time alone on their own."""
    xs = [float(u) for u in profile.micro_batch_sizes]
    layers = [i for i in range(profile.num_blocks) if all(a[i] is not None for a in anatomies)]
    if not layers:
        return profile
    spec = _reference_spec(dev)
    dtype = "bf16" if profile.dtype in ("bfloat16", "float16") else "fp32"
    blocks = list(profile.blocks)
    for i in layers:
        found: dict[float, tuple[Anatomy, float]] = {}
        whole: dict[float, tuple[float, float]] = {}  # size -> (measured forward, its ops' roofline time)
        for u, a, m in zip(xs, anatomies, measured, strict=True):
            anatomy = a[i]
            assert anatomy is not None
            found[u] = (anatomy, float(m[i].saved_bytes))
            whole[u] = (m[i].forward_s, block_time([op for n in anatomy.nodes for op in n.ops], spec, dtype))

        def seconds(ops: Sequence[OpCount], u: float, whole: dict[float, tuple[float, float]] = whole) -> float:
            measured_s, counted_s = whole[u]
            return measured_s * block_time(ops, spec, dtype) / counted_s if counted_s > 0 else 0.0

        memory = options_of(found, seconds, lambda ops: float(sum(op.flops for op in ops)))
        blocks[i] = replace(blocks[i], layer=True, memory=memory)
    return replace(profile, blocks=tuple(blocks))


def _reference_spec(dev: torch.device) -> DeviceSpec:
    """The roofline that splits a measured forward among its parts: the catalogue's entry for
    this GPU (an H100's where it has none), or this CPU measured."""
    if dev.type == "cuda":
        name = match_device(_device_name(dev))
        return device_spec(name if name is not None else "h100")
    return measure_cpu()


def _load_average() -> float | None:
    """The machine's 1-minute load average (None where the system does not say)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def drop_export_one(traced: TracedModel, sizes: list[int]) -> bool:
    """Whether to skip micro-batch size 1 (and drop it from ``sizes``): ``torch.export``
    specialises a dimension of size 1, so an export trace at 1 has another graph than at the
    sizes above it. A profile holds one graph; the planner keeps u = 1 apart (search.py)."""
    if traced.tracer == "export" and traced.micro_batch_size == 1 and len(sizes) > 1:
        sizes.remove(1)
        return True
    return False


def _device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ProfileError(f"unknown device {device!r}; use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ProfileError("--device cuda, but no CUDA device is visible; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ProfileError(f"cannot measure on {dev.type}; use cpu or cuda (meta models are planned analytically)")
    return dev


def _to_device(x: Any, dev: torch.device) -> Any:
    return torch.utils._pytree.tree_map(lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t, x)


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(dev)}"
    cpu = platform.processor() or platform.machine()
    n = torch.get_num_threads()
    return f"cpu: {cpu}, {n} thread{'s' if n != 1 else ''}"


def _make_profile(
    loaded: Any,
    traces: list[TracedModel],
    measured: list[list[BlockMeasurement]],
    sizes: list[int],
    dev: torch.device,
    recipe: TraceRecipe,
) -> Profile:
    ref = traces[0]
    gm = ref.gm
    xs = [float(u) for u in sizes]

    def fit(get: Callable[[BlockMeasurement], float], i: int) -> Affine:
        return Affine.fit(xs, [get(m[i]) for m in measured])

    blocks = [
        block_cost(
            b,
            gm,
            forward=fit(lambda m: m.forward_s, i),
            backward=fit(lambda m: m.backward_s, i),
            backward_input=fit(lambda m: m.backward_input_s, i),
            backward_weight=fit(lambda m: m.backward_weight_s, i)
            if all(m[i].backward_weight_s >= 0 for m in measured)
            else None,
            saved_bytes=fit(lambda m: float(m.saved_bytes), i),
            kept_bytes=fit(lambda m: float(m.kept_bytes), i),
            backward_bytes=fit(lambda m: float(m.backward_bytes), i),
            shared=ref.shared_params,
            spread=Spread(*(max(m[i].spread[k] for m in measured) for k in range(4))),
        )
        for i, b in enumerate(ref.blocks)
    ]
    tensors = crossing_tensors(traces)
    dtypes = {p.dtype for p in gm.parameters()}
    return Profile(
        model=str(loaded.spec),
        recipe=recipe.traced(loaded.spec, ref.tracer, ref.fingerprint()),
        device=_device_name(dev),
        torch_version=torch.__version__,
        dtype=str(dtypes.pop()).removeprefix("torch.") if len(dtypes) == 1 else "mixed",
        micro_batch_sizes=tuple(sizes),
        method="measured",
        blocks=tuple(blocks),
        tensors=tensors,
        shared_params=ref.shared_params,
    )


def crossing_tensors(traces: Sequence[TracedModel]) -> tuple[TensorCost, ...]:
    """Every tensor a block reads from another block (or from the model's inputs), with its
    bytes fitted over the traces' micro-batch sizes (the first trace gives names and shapes)."""
    ref = traces[0]
    xs = [float(t.micro_batch_size) for t in traces]
    nodes = {n.name: n for n in ref.gm.graph.nodes}
    tensors = []
    for name in _crossing_values(ref):
        src = ref.block_of.get(name, -1)
        dsts = tuple(sorted({ref.block_of[u.name] for u in nodes[name].users if u.name in ref.block_of} - {src}))
        info = ref.values[name]
        tensors.append(
            TensorCost(
                name=name,
                src=src,
                dsts=dsts,
                bytes=Affine.fit(xs, [float(t.values[name].bytes) for t in traces]),
                dtype=info.dtype,
                shape=info.shape,
            )
        )
    return tuple(tensors)


def block_cost(
    block: Block,
    gm: torch.fx.GraphModule,
    *,
    forward: Affine,
    backward: Affine,
    backward_input: Affine,
    saved_bytes: Affine,
    backward_weight: Affine | None = None,
    forward_flops: Affine = _ZERO,
    backward_flops: Affine = _ZERO,
    shared: Sequence[tuple[str, tuple[int, ...]]] = (),
    spread: Spread = _NO_SPREAD,
    kept_bytes: Affine = _ZERO,
    backward_bytes: Affine = _ZERO,
) -> BlockCost:
    """A block's costs from its fits; parameters are the ones it owns in ``gm`` (plus, apart,
    the ``shared`` ones — ``TracedModel.shared_params`` — it uses but an earlier block owns);
    the weight-gradient part of backward is ``backward_weight`` where it was measured, else
    what the input-gradient part leaves (>= 0)."""
    owned = [gm.get_parameter(p) for p in block.params]
    borrowed = [gm.get_parameter(name) for name, users in shared if block.index in users and block.index != min(users)]
    return BlockCost(
        name=block.name,
        nodes=block.nodes,
        params=sum(p.numel() for p in owned),
        param_bytes=sum(p.numel() * p.element_size() for p in owned),
        forward_s=forward,
        backward_s=backward,
        backward_input_s=backward_input,
        backward_weight_s=backward_weight
        if backward_weight is not None
        else Affine(
            max(0.0, backward.intercept - backward_input.intercept),
            max(0.0, backward.slope - backward_input.slope),
        ),
        saved_bytes=saved_bytes,
        forward_flops=forward_flops,
        backward_flops=backward_flops,
        shared_param_bytes=sum(p.numel() * p.element_size() for p in borrowed),
        spread=spread,
        kept_bytes=_floor(kept_bytes),
        backward_bytes=_floor(backward_bytes),
    )


def _floor(fit: Affine) -> Affine:
    """A fit of bytes kept >= 0 at every micro-batch size (a fit through noise can dip below)."""
    return Affine(max(0.0, fit.intercept), max(0.0, fit.slope))


def _crossing_values(traced: TracedModel) -> list[str]:
    """Names of values read by a block other than the one that makes them, graph order."""
    out = []
    for n in traced.gm.graph.nodes:
        if n.op not in ("placeholder", "call_module", "call_function", "call_method"):
            continue
        src = traced.block_of.get(n.name, -1)
        if any(traced.block_of.get(u.name, src) != src for u in n.users):
            out.append(n.name)
    return out
