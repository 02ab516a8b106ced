"""The analytic profile: a model's block costs from counting, for hardware you are not at.

The model is built on the meta device (no weights allocated), traced by the measured
profiler's own tracer (``trace.trace_model``: same blocks, same fingerprint for the same
model and dtype), and every block's segment is run on meta inputs, forward and backward,
under :mod:`autopipe.costs.counting`, at each micro-batch size. Identical blocks (a transformer's
layers) are counted once. Per op, time is a roofline (Williams et al. 2009)::

    t_op = max(flops * work / (peak[dtype] * efficiency(dtype, size)),
               bytes / (memory_bandwidth * memory_efficiency)) + op_overhead_s

where ``efficiency(dtype, size)`` is the device's saturating curve in the GEMM's size,
``(M K N) ** (1/3)`` (``DeviceSpec.efficiency``; flat for ops that are not GEMMs) and ``work``
the share of its counted FLOPs the kernel runs (``OpCount.work``: half for causal fused attention)

and a block's forward / backward / input-gradient time is the sum over its ops. Bytes saved
for backward are counted by the measured profiler's ``saved_tensors_hooks`` path, so the two
profiles agree on them exactly; the result is a :class:`~autopipe.costs.profile.Profile` with
``method="analytic"``, interchangeable with a measured one as planner input.

Precision. ``fp32``: fp32 weights, activations and matmuls. ``tf32``: the same with TF32
matmuls. ``bf16`` / ``fp16`` (mixed precision, Micikevicius et al. 2018): weights and
activations in 16 bits, fp32 master weights and Adam moments. ``fp8`` (Transformer Engine's
recipe, Micikevicius et al. 2022, "FP8 formats for deep learning"): the linear layers' GEMMs
(``mm`` / ``addmm``, forward and backward) at the device's FP8 peak; everything else, attention
included (TE's fused attention runs in bf16 by default), at bf16. Memory as bf16 mixed precision:
TE keeps bf16 weights with fp32 masters, so the 16 bytes below (its FP8 weight copies and
transposes, about 2 bytes per parameter while cached, are not counted); activations in bf16 but
the layers' linear inputs, which TE saves in FP8 (``activations.fp8``). Device memory per parameter,
either way (:data:`BYTES_PER_PARAM`)::

    fp32:  4 weight + 4 grad + 4 Adam m + 4 Adam v                       = 16 bytes
    bf16:  2 weight + 2 grad + 4 fp32 master + 4 Adam m + 4 Adam v       = 16 bytes

which the planner takes as ``state_factor = 16 / (bytes of one stored parameter)`` times the
profile's parameter bytes (:func:`state_factor`); activations are counted in the stored dtype.
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from autopipe.costs.activations.anatomy import Anatomy, anatomy_of, options_of
from autopipe.costs.counting import (
    BlockCount,
    OpCount,
    block_time,
    count_block,
    count_loss,
    keys_of,
    leaf,
    numbered,
    op_dtype,
    op_time,
)
from autopipe.costs.deepen import Repeat, deepen_profile, repeat_of
from autopipe.costs.degrees import Degrees, device_comm, device_ops, device_params, device_saved
from autopipe.costs.devices import DeviceSpec
from autopipe.costs.experts import expert_storages, moe_config
from autopipe.costs.fusion import fuse
from autopipe.costs.measure.measured import Progress, block_cost, crossing_tensors, drop_export_one
from autopipe.costs.measure.timing import flat_inputs_of, storage_key
from autopipe.costs.profile import Affine, BlockCost, ExpertTimes, MemoryOption, Profile
from autopipe.costs.tensor import TensorSplit, block_kinds, comm_s, exposed, split_params
from autopipe.errors import ModelLoadError, ProfileError
from autopipe.graph.outputs import graph_outputs, training_loss
from autopipe.graph.recipe import DEFAULT_RECIPE, TraceRecipe
from autopipe.graph.segment import extract
from autopipe.graph.shallow import repeated_layers, shallow_copy
from autopipe.graph.trace import TracedModel, fx_node_names, trace_model
from autopipe.graph.units import node_units

__all__ = [
    "ATTENTION",
    "BYTES_PER_PARAM",
    "PRECISIONS",
    "ModelCounts",
    "Precision",
    "analytic_profile",
    "block_time",
    "count_model",
    "op_dtype",
    "op_time",
    "profile_from_counts",
    "state_factor",
]


@dataclass(frozen=True)
class Precision:
    """How a model is stored and computed in training."""

    name: str  # "fp32", "tf32", "bf16", "fp16", "fp8"
    dtype: torch.dtype  # weights and activations
    compute: str  # the device peak that prices its ops
    bytes_per_param: float  # device memory per parameter: weights, grads, master, Adam
    linear: str = ""  # the peak that prices the linear layers' GEMMs instead ("": ``compute``)


PRECISIONS = {
    "fp32": Precision("fp32", torch.float32, "fp32", 16.0),
    "tf32": Precision("tf32", torch.float32, "tf32", 16.0),
    "bf16": Precision("bf16", torch.bfloat16, "bf16", 16.0),
    "fp16": Precision("fp16", torch.float16, "fp16", 16.0),
    "fp8": Precision("fp8", torch.bfloat16, "bf16", 16.0, linear="fp8"),
}
BYTES_PER_PARAM = 16.0
ATTENTION = ("flash", "unfused")  # how attention runs: a fused (FlashAttention) kernel, or scores materialised


def precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise ProfileError(f"unknown dtype {name!r}; use one of: {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


def state_factor(profile: Profile, bytes_per_param: float = BYTES_PER_PARAM) -> float:
    """Device bytes per parameter byte of ``profile`` (``PlanRequest.state_factor``)."""
    params = sum(b.params for b in profile.blocks)
    nbytes = sum(b.param_bytes for b in profile.blocks)
    return bytes_per_param * params / nbytes if nbytes else 4.0


@dataclass(frozen=True)
class ModelCounts:
    """A model traced and counted at several micro-batch sizes (device independent)."""

    traces: tuple[TracedModel, ...]  # one per size, ascending
    counts: tuple[tuple[BlockCount, ...], ...]  # [size][block]
    loaded: Any  # the load.LoadedModel it came from (built on meta)
    precision: Precision
    recipe: TraceRecipe = DEFAULT_RECIPE  # how it was asked to be traced
    repeat: Repeat | None = None  # counted on a shallow copy: how its profile is deepened
    # [size][block]: what each layer's parts save (costs/activations/anatomy.py); None for a block that is no layer
    anatomies: tuple[tuple[Anatomy | None, ...], ...] = ()
    attention: str = "flash"  # ATTENTION: how attention was counted (flash: the fused kernel; unfused: scores kept)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(t.micro_batch_size for t in self.traces)


def count_model(
    loaded: Any,
    *,
    micro_batch_sizes: Sequence[int] = (2, 4),
    dtype: str = "fp32",
    recipe: TraceRecipe = DEFAULT_RECIPE,
    progress: Progress | None = None,
    shallow: bool = False,
    attention: str = "flash",
    eager_loss: bool = False,
) -> ModelCounts:
    """Trace ``loaded`` (a ``load.LoadedModel``, ideally built on meta) as ``recipe`` says
    (tracer, leaf modules, block limit) and count every block; ``progress(what, done, total)``
    is told each trace and each block counted. ``shallow``: a model of identical layers is
    traced and counted as a copy with three of them (``costs.deepen``); its traces and counts
    are the copy's, and :func:`profile_from_counts` prices the whole model, exactly. ``attention``: ``flash``
    (the fused kernel) or ``unfused`` (scores materialised, as before FlashAttention: ``sdpa.fused_attention``).
    ``eager_loss``: the loss's memory-bound kernels kept apart where kernels are fused (``counting.count_loss``;
    a framework's unfused loss, ``costs.losses``, given as ``loaded``'s ``loss_fn``)."""
    if attention not in ATTENTION:
        raise ProfileError(f"unknown attention {attention!r}; use one of: {', '.join(ATTENTION)}")
    prec = precision(dtype)
    whole = functools.partial(  # the model counted whole: where a shallow copy cannot stand for it
        count_model,
        loaded,
        micro_batch_sizes=micro_batch_sizes,
        dtype=dtype,
        recipe=recipe,
        progress=progress,
        attention=attention,
        eager_loss=eager_loss,
    )
    sizes = sorted(set(micro_batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ProfileError(f"micro-batch sizes must be positive integers (got {list(micro_batch_sizes)})")
    model = _on_meta(loaded.model, prec.dtype)
    model.train()
    layers = repeated_layers(model) if shallow and recipe.tracer != "export" and recipe.max_blocks is None else None
    shallow_model = shallow_copy(model, layers) if layers is not None else model
    traces: list[TracedModel] = []
    counts: list[tuple[BlockCount, ...]] = []
    anatomies: list[tuple[Anatomy | None, ...]] = []
    report = progress or _silent
    for u in list(sizes):
        report(f"tracing at micro-batch size {u}", 0, 0)
        inputs = _meta_inputs(loaded.make_inputs(u), prec.dtype)
        traced = trace_model(
            shallow_model,
            inputs,
            micro_batch_size=u,
            recipe=replace(recipe, tracer=traces[0].tracer) if traces else recipe,
            source=loaded.spec.path,
        )
        if layers is not None and traced.tracer != "fx":  # only fx names a deeper graph: count it all
            return whole()
        if drop_export_one(traced, sizes):
            continue
        if traces and [b.nodes for b in traced.blocks] != [b.nodes for b in traces[0].blocks]:
            raise ProfileError(
                f"the model's graph changes with the micro-batch size ({sizes[0]} vs {u}); count one size only"
            )
        traces.append(traced)
        step = _step(report, f"counting at micro-batch size {u}")
        counted = _count_traced(loaded, (model, shallow_model), traced, inputs, prec, step, (attention, eager_loss))
        counts.append(tuple(c for c, _ in counted))
        anatomies.append(tuple(a for _, a in counted))
    repeat = (
        repeat_of(
            traces[0],
            counts,
            layers,
            fx_node_names(model, _meta_inputs(loaded.make_inputs(sizes[0]), prec.dtype), recipe.leaf_modules),
        )
        if layers is not None
        else None
    )
    if layers is not None and repeat is None:  # the copy does not prove the whole: count it all
        return whole()
    return ModelCounts(tuple(traces), tuple(counts), loaded, prec, recipe, repeat, tuple(anatomies), attention)


def _on_meta(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``model`` on meta in ``dtype``; a model with real weights is copied, never changed."""
    if any(not t.is_meta for t in (*model.parameters(), *model.buffers())):
        model = copy.deepcopy(model).to("meta")
    return model.to(dtype)


def _meta_inputs(inputs: Any, dtype: torch.dtype) -> Any:
    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        t = t.to("meta")
        return t.to(dtype) if t.is_floating_point() else t

    return torch.utils._pytree.tree_map(move, inputs)


def _silent(what: str, done: int, total: int) -> None:
    pass


def _step(report: Progress, what: str) -> Callable[[int, int], None]:
    return lambda done, total: report(what, done, total)


def _count_traced(
    loaded: Any,
    models: tuple[nn.Module, nn.Module],
    traced: TracedModel,
    inputs: Any,
    prec: Precision,
    step: Callable[[int, int], None],
    how: tuple[str, bool],
) -> tuple[tuple[BlockCount, Anatomy | None], ...]:
    """One micro-batch size's counts of ``traced`` (``models``: the model and the copy traced):
    its training loss, the MoE experts' storages and the graph's units found, then every block
    (``how``: the attention kind and ``eager_loss``, as :func:`count_model` takes them)."""
    model, shallow_model = models
    u = traced.micro_batch_size
    targets = _meta_inputs(loaded.make_targets(u), prec.dtype) if loaded.make_targets is not None else None
    loss = training_loss(loaded, traced, shallow_model, inputs, targets)
    found = moe_config(model)
    experts = expert_storages(traced.gm, found[0]) if found is not None else frozenset()
    units = node_units(traced.gm, shallow_model, [b.nodes for b in traced.blocks])
    fp8 = prec.linear == "fp8"  # Transformer Engine keeps the layers' linear inputs in FP8 (activations.fp8)
    return _count_blocks(traced, inputs, loss, step, experts, units, how[0] == "flash", how[1], fp8)


def _count_blocks(
    traced: TracedModel,
    inputs: Any,
    loss: Callable[[list[Any]], torch.Tensor] | None = None,
    progress: Callable[[int, int], None] | None = None,
    experts: frozenset[int] = frozenset(),
    units: Mapping[str, str] | None = None,
    flash: bool = True,
    eager_loss: bool = False,
    fp8_linears: bool = False,
) -> tuple[tuple[BlockCount, Anatomy | None], ...]:
    """Count each block on the values the blocks before it produced; a block that computes
    what an earlier one did (same ops, same shapes) reuses its count and its outputs' layout.
    A block with units (``graph.units``: a transformer layer) also gets its anatomy.

    ``experts``: storage keys of routed-expert weights, whose ops are marked (``counting``);
    ``fp8_linears``: the layer blocks' linear inputs saved in FP8 (``activations.fp8``; Megatron-Core
    runs its transformer layers, not the embedding or the output layer, under FP8).
    The training loss (computed on the last stage, after the last block) is counted in the
    last block, as the measured profiler does; a loss that cannot run on meta tensors (one
    that reads values, say) is left out and costs nothing.
    """
    gm = traced.gm
    exclude = {storage_key(p) for p in gm.parameters()}
    env: dict[str, Any] = dict(zip(traced.input_names, flat_inputs_of(traced, inputs), strict=True))
    seen: dict[tuple[Any, ...], tuple[BlockCount, tuple[Any, ...], Anatomy | None]] = {}
    by_name = {n.name: n for n in gm.graph.nodes}
    units = units or {}
    out: list[tuple[BlockCount, Anatomy | None]] = []
    for i, block in enumerate(traced.blocks):
        if progress is not None:
            progress(i, len(traced.blocks))
        nodes = [by_name[name] for name in block.nodes]
        key, _inputs, output_names = _signature(gm, nodes, env)
        if key in seen:
            count, outs, anatomy = seen[key]
            outs = _fresh_like(outs)
        else:
            seg = extract(gm, block.nodes)
            args = [env[name] for name in seg.inputs]
            layer = any(n in units for n in block.nodes)
            count, outs = count_block(seg.module, args, exclude, experts, flash, fp8_linears and layer)
            anatomy = None
            if layer:
                anatomy = anatomy_of(seg.module, [leaf(a) for a in args], units, exclude)
            seen[key] = (count, outs, anatomy)
        env.update(zip(output_names, outs, strict=True))
        out.append((count, anatomy))
    if progress is not None:
        progress(len(out), len(out))
    if loss is not None and out:
        names, _ = graph_outputs(gm)
        try:
            extra = count_loss(loss, [env[n] if n is not None else None for n in names], exclude, eager_loss)
        except ModelLoadError:
            return tuple(out)
        last, _ = out[-1]
        extra = numbered(extra, keys_of(last))  # the loss's storages numbered after the block's
        out[-1] = (
            BlockCount(
                last.forward + extra.forward,
                last.backward + extra.backward,
                last.backward_input + extra.backward_input,
                last.saved_bytes + extra.saved_bytes,
                last.escapes | extra.escapes,
                last.grads | extra.grads,
            ),
            None,  # the loss is no layer's part: the last block offers nothing
        )
    return tuple(out)


def _fresh_like(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """New meta tensors with the shapes, strides and storages of ``values`` (shared storages
    stay shared among them), so no two blocks' outputs are taken for one storage."""
    bases: dict[int, torch.Tensor] = {}
    out = []
    for v in values:
        if not isinstance(v, torch.Tensor):
            out.append(v)
            continue
        key = storage_key(v)
        if key not in bases:
            numel = v.untyped_storage().nbytes() // max(1, v.element_size())
            bases[key] = torch.empty(numel, dtype=v.dtype, device="meta")
        out.append(bases[key].as_strided(v.shape, v.stride(), v.storage_offset()))
    return tuple(out)


def _signature(
    gm: torch.fx.GraphModule, nodes: Sequence[torch.fx.Node], env: dict[str, Any]
) -> tuple[tuple[Any, ...], list[str], list[str]]:
    """The block's computation up to renaming (ops, constants, shapes of inputs and weights),
    with the names of the values it reads (first-use order, as ``extract``) and makes for others."""
    inside = set(nodes)
    index: dict[torch.fx.Node, str] = {}
    items: list[Any] = []
    inputs: list[str] = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a in index or a in inside:
                continue
            if a.op == "get_attr":
                v = operator.attrgetter(str(a.target))(gm)
                items.append(("attr", _describe(v), isinstance(v, nn.Parameter)))
            else:
                inputs.append(a.name)
                items.append(("in", _describe(env[a.name])))
            index[a] = f"%{len(index)}"
        if n.op == "call_module":
            m = gm.get_submodule(str(n.target))
            head: Any = ("mod", repr(m), tuple(_describe(t) for t in (*m.parameters(), *m.buffers())))
        else:
            head = (n.op, str(n.target))
        items.append((head, repr(torch.fx.node.map_arg((n.args, n.kwargs), lambda a: index[a]))))
        index[n] = f"%{len(index)}"
    outputs = [n.name for n in nodes if any(u not in inside for u in n.users)]
    return tuple(items), inputs, outputs


def _describe(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), str(v.dtype), v.requires_grad or v.is_floating_point())
    return repr(v)


# --------------------------------------------------------------------------- time


def profile_from_counts(
    counts: ModelCounts, spec: DeviceSpec, split: TensorSplit | Degrees | None = None, fused: bool = False
) -> Profile:
    """Price ``counts`` on ``spec``: the analytic Profile; with ``split``, one device's share
    of each block at its parallel degrees (a ``TensorSplit``: tensor parallelism alone; a
    ``costs.degrees.Degrees``: tensor, context and expert parallelism): ops, communication,
    saved bytes and parameters per device (FLOPs per device too), ``BlockCost.expert_params``
    the routed experts' share of the parameters. ``fused``: the memory-bound ops between two
    GEMMs or attention kernels run as one fused kernel (``costs.fusion``; ``Target.fused_kernels``:
    what the framework that runs the plan does), else one kernel each, as eager PyTorch."""
    d = split if isinstance(split, Degrees) else Degrees(tensor=split)
    ref = counts.traces[0]
    gm = ref.gm
    xs = [float(u) for u in counts.sizes]
    compute, linear = counts.precision.compute, counts.precision.linear
    elt = float(torch.empty((), dtype=counts.precision.dtype).element_size())
    tsplit = d.tensor
    kinds = block_kinds([b.name for b in ref.blocks], tsplit.shape) if tsplit else ("whole",) * len(ref.blocks)
    moe = d.experts.shape if d.experts is not None else None

    def fit(i: int, what: Callable[[BlockCount, float], float]) -> Affine:
        return Affine.fit(xs, [float(what(c[i], u)) for c, u in zip(counts.counts, xs, strict=True)])

    def ops(i: int, seq: Sequence[OpCount]) -> Sequence[OpCount]:
        return device_ops(seq, kinds[i], d)

    memo: dict[tuple[int, str, float], tuple[float, ...]] = {}  # forward, backward, input-gradient; the experts'

    def times(i: int, c: BlockCount, u: float) -> tuple[float, ...]:
        key = (id(c), kinds[i], u)  # identical blocks share one BlockCount (_count_blocks)
        if moe is not None:
            key = (*key, moe.moe_layers[i])  # type: ignore[assignment]
        if key not in memo:
            f, b, bi = (fuse(a, c.escapes, c.grads) if fused else a for a in (c.forward, c.backward, c.backward_input))
            work = ops(i, f), ops(i, b), ops(i, bi)
            layers = moe.moe_layers[i] if moe is not None else 0
            attention = sum(op.kind == "attention" for op in c.forward) if d.cp > 1 else 0  # layers that attend
            whole = _work_times(work, kinds[i], u, d, elt, (layers, attention), spec, (compute, linear))
            routed = [block_time([op for op in w if op.expert], spec, compute, linear) if layers else 0.0 for w in work]
            memo[key] = (*whole, *routed)
        return memo[key]

    def one(i: int, b: Any) -> BlockCost:
        cost = block_cost(
            b,
            gm,
            forward=fit(i, lambda c, u: times(i, c, u)[0]),
            backward=fit(i, lambda c, u: times(i, c, u)[1]),
            backward_input=fit(i, lambda c, u: times(i, c, u)[2]),
            saved_bytes=fit(i, lambda c, u: device_saved(c.saved_bytes, kinds[i], d)),
            forward_flops=fit(i, lambda c, u: sum(op.flops for op in ops(i, c.forward))),
            backward_flops=fit(i, lambda c, u: sum(op.flops for op in ops(i, c.backward))),
            shared=ref.shared_params,
        )
        on = (
            lambda a: ops(i, a),
            lambda a: block_time(a, spec, compute, linear),
            lambda x: device_saved(x, kinds[i], d),
        )
        memory = _options(counts, i, *on)  # a layer's parts on one device
        routed = ExpertTimes(*(fit(i, _nth(times, i, k)) for k in (3, 4, 5)))
        cost = replace(cost, layer=bool(memory) or cost.layer, memory=memory, experts_s=routed)
        return _device_share(cost, moe.expert_params[i] if moe is not None else 0, kinds[i], d, elt)

    blocks = [one(i, b) for i, b in enumerate(ref.blocks)]
    loaded = counts.loaded
    where = d.describe()
    profile = Profile(
        model=str(loaded.spec),
        recipe=counts.recipe.traced(loaded.spec, ref.tracer, ref.fingerprint()),
        device=f"{spec.name}: {spec.description} (analytic, {counts.precision.name}{', ' + where if where else ''})",
        torch_version=torch.__version__,
        dtype=str(counts.precision.dtype).removeprefix("torch."),
        micro_batch_sizes=counts.sizes,
        method="analytic",
        blocks=tuple(blocks),
        tensors=crossing_tensors(counts.traces),
        shared_params=ref.shared_params,
    )
    return deepen_profile(profile, counts.repeat) if counts.repeat is not None else profile


def _nth(
    times: Callable[[int, BlockCount, float], tuple[float, ...]], i: int, k: int
) -> Callable[[BlockCount, float], float]:
    """The ``k``-th of block ``i``'s ``times``, as ``fit`` takes it."""
    return lambda c, u: times(i, c, u)[k]


def _work_times(
    work: tuple[Sequence[OpCount], Sequence[OpCount], Sequence[OpCount]],
    kind: str,
    u: float,
    d: Degrees,
    elt: float,
    layers: tuple[int, int],
    spec: DeviceSpec,
    dtypes: tuple[str, str],
) -> tuple[float, float, float]:
    """(forward, backward, input-gradient) seconds of one device's share of a block (its ops
    ``work``, forward / backward / input-gradient) with its communication: the tensor-parallel
    collectives may hide behind the GEMMs (``TensorSplit.overlap``, ``tensor.exposed``); the
    context ring and the expert all-to-all (``degrees.device_comm``) are paid as priced there;
    ``layers``: how many of the block's layers are MoE layers and how many attend (under CP)."""
    compute, linear = dtypes
    fwd, bwd, bwd_in = work
    moe_layers, attention = layers
    att = (_attention_time(fwd, spec, compute), _attention_time(bwd, spec, compute)) if attention else (0.0, 0.0)
    comm = device_comm(kind, u, d, elt, moe_layers, attention, att)
    tp = comm_s(kind, u, d.tensor, elt) if d.tensor is not None else (0.0, 0.0)
    f = exposed(block_time(fwd, spec, compute, linear), tp[0], d.tensor) + comm[0] - tp[0]
    b = exposed(block_time(bwd, spec, compute, linear), tp[1], d.tensor) + comm[1] - tp[1]
    bi = exposed(block_time(bwd_in, spec, compute, linear), tp[1], d.tensor) + comm[1] - tp[1]
    return f, b, min(bi, b)


def _device_share(cost: BlockCost, experts: int, kind: str, d: Degrees, elt: float) -> BlockCost:
    """``cost``'s parameters as one device of ``d`` holds them (``experts``: the routed experts')."""
    if (d.tensor is None or kind == "whole") and not experts:
        return cost
    params, mine = device_params(cost.params, experts, kind, d)
    per = cost.param_bytes / cost.params if cost.params else elt
    shared = float(cost.shared_param_bytes)
    if d.tensor is not None:
        shared = split_params(round(shared / elt), kind, d.t, d.tensor.shape) * elt
    return replace(
        cost, params=params, param_bytes=round(params * per), shared_param_bytes=round(shared), expert_params=mine
    )


def _options(
    counts: ModelCounts,
    i: int,
    device: Callable[[Sequence[OpCount]], Sequence[OpCount]],
    seconds: Callable[[Sequence[OpCount]], float],
    scaled: Callable[[float], float],
) -> tuple[MemoryOption, ...]:
    """Block ``i``'s memory options (``costs.activations.anatomy.options_of``) from its anatomy
    at every size counted: () for a block that is no layer; ``device`` gives one device's share
    of ops, ``seconds`` prices them, ``scaled`` gives one device's share of saved bytes."""
    found = [a[i] for a in counts.anatomies] if counts.anatomies else []
    if not found or any(a is None for a in found):
        return ()
    xs = [float(u) for u in counts.sizes]
    by_size = {u: (a, float(c[i].saved_bytes)) for u, a, c in zip(xs, found, counts.counts, strict=True) if a}

    def flops(again: Sequence[OpCount]) -> float:
        return float(sum(op.flops for op in device(again)))

    return options_of(by_size, lambda again, u: seconds(device(again)), flops, scaled)


def _attention_time(ops: Sequence[OpCount], spec: DeviceSpec, compute: str) -> float:
    return block_time([op for op in ops if op.kind == "attention"], spec, compute)


def analytic_profile(
    loaded: Any,
    spec: DeviceSpec,
    *,
    micro_batch_sizes: Sequence[int] = (2, 4),
    dtype: str = "fp32",
    recipe: TraceRecipe = DEFAULT_RECIPE,
    progress: Progress | None = None,
) -> Profile:
    """Count ``loaded`` on meta, traced as ``recipe`` says, and price it on ``spec`` (see the
    module docstring); ``progress(what, done, total)`` as :func:`count_model`."""
    counts = count_model(
        loaded, micro_batch_sizes=micro_batch_sizes, dtype=dtype, recipe=recipe, progress=progress, shallow=True
    )
    return profile_from_counts(counts, spec)
