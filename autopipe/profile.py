"""Measure what each block of a model costs: time, saved activations, parameters, edges.

For each micro-batch size the model is traced (``trace.py``), every block is cut out as its
own module (``segment.py``) and run on the values the blocks before it produced:

- forward and backward time: warm-up runs, then the median of ``repeat`` timed runs — CUDA
  events with synchronisation on a GPU, ``time.perf_counter`` on the CPU. Forwards are timed
  as in training: each run is a whole forward, block after block on what the blocks before
  made, keeping everything it made (and its graph) alive until the run ends;
- backward split into input-gradient (``torch.autograd.grad`` with respect to the block's
  inputs only, which skips weight-gradient kernels) and weight-gradient (the rest), the B and W
  of zero-bubble schedules;
- bytes saved for backward, counted exactly with ``torch.autograd.graph.saved_tensors_hooks``:
  every saved tensor's storage once, parameters excluded (they are counted as parameters);
- parameter bytes of the parameters each block owns, and bytes of every tensor on every edge.

Times and bytes are then fitted as affine functions of the micro-batch size (``costs.Affine``)
so the planner can price any micro-batch count.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autopipe.costs import Affine, BlockCost, Profile, TensorCost
from autopipe.errors import ProfileError
from autopipe.outputs import graph_outputs, output_builder
from autopipe.segment import Segment, extract
from autopipe.trace import Block, TracedModel, trace_model

__all__ = ["BlockMeasurement", "crossing_tensors", "measure_blocks", "profile_model", "saved_bytes", "storage_key", "time_call"]

Progress = Callable[[str, int, int], None]
_ZERO = Affine(0.0, 0.0)


@dataclass(frozen=True)
class BlockMeasurement:
    """One block at one micro-batch size."""

    forward_s: float
    backward_s: float
    backward_input_s: float
    saved_bytes: int
    backward_weight_s: float = -1.0  # measured W of a split backward; < 0: B - B_input


def profile_model(
    loaded: Any,
    *,
    micro_batch_sizes: Sequence[int],
    tracer: str = "auto",
    leaf_modules: Sequence[str] = (),
    max_blocks: int | None = None,
    warmup: int = 2,
    repeat: int = 5,
    device: str = "cpu",
    progress: Progress | None = None,
    threads: int | None = 1,
) -> Profile:
    """Trace and measure ``loaded`` (a ``load.LoadedModel``) at each micro-batch size.

    On the CPU the blocks run on ``threads`` threads (default 1: each pipeline rank of
    ``autopipe run`` runs on one thread, so that is what its stages will cost); ``None``
    keeps torch's current setting.
    """
    if threads is not None and threads < 1:
        raise ProfileError(f"threads must be at least 1 (got {threads})")
    before = torch.get_num_threads()
    if threads is not None and not device.startswith("cuda"):
        torch.set_num_threads(threads)
    try:
        return _profile(loaded, micro_batch_sizes, tracer, leaf_modules, max_blocks, warmup, repeat, device, progress)
    finally:
        torch.set_num_threads(before)


def _profile(
    loaded: Any,
    micro_batch_sizes: Sequence[int],
    tracer: str,
    leaf_modules: Sequence[str],
    max_blocks: int | None,
    warmup: int,
    repeat: int,
    device: str,
    progress: Progress | None,
) -> Profile:
    sizes = sorted(set(micro_batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ProfileError(f"micro-batch sizes must be positive integers (got {list(micro_batch_sizes)})")
    if warmup < 0 or repeat < 1:
        raise ProfileError(f"need warmup >= 0 and repeat >= 1 (got warmup={warmup}, repeat={repeat})")
    dev = _device(device)
    model: nn.Module = loaded.model.to(dev)
    model.train()
    traces: list[TracedModel] = []
    measured: list[list[BlockMeasurement]] = []
    for k, u in enumerate(list(sizes)):
        inputs = _to_device(loaded.make_inputs(u), dev)
        traced = trace_model(
            model,
            inputs,
            micro_batch_size=u,
            tracer=traces[0].tracer if traces else tracer,
            leaf_modules=leaf_modules,
            max_blocks=max_blocks,
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

        loss = _training_loss(loaded, traced, model, inputs, u, dev)
        measured.append(
            measure_blocks(traced, inputs, warmup=warmup, repeat=repeat, progress=report, loss=loss)
        )
    return _make_profile(loaded, traces, measured, sizes, dev, leaf_modules, max_blocks)


def drop_export_one(traced: TracedModel, sizes: list[int]) -> bool:
    """Whether to skip micro-batch size 1 (and drop it from ``sizes``): ``torch.export``
    specialises a dimension of size 1, so an export trace at 1 has another graph than at the
    sizes above it. A profile holds one graph; the planner keeps u = 1 apart (search.py)."""
    if traced.tracer == "export" and traced.micro_batch_size == 1 and len(sizes) > 1:
        sizes.remove(1)
        return True
    return False


def _training_loss(
    loaded: Any, traced: TracedModel, model: nn.Module, inputs: Any, u: int, dev: torch.device
) -> Callable[[list[Any]], torch.Tensor]:
    """The model file's ``loss_fn`` on the graph's flat outputs and ``u`` samples of targets."""
    build = output_builder(traced.gm, traced.tracer, model, inputs)
    targets = _to_device(loaded.make_targets(u), dev) if loaded.make_targets is not None else None
    loss_fn: Callable[[object, object], torch.Tensor] = loaded.loss_fn

    def loss(flat: list[Any]) -> torch.Tensor:
        return loss_fn(build(flat), targets)

    return loss


def measure_blocks(
    traced: TracedModel,
    inputs: Any,
    *,
    warmup: int = 2,
    repeat: int = 5,
    progress: Callable[[int, int], None] | None = None,
    loss: Callable[[list[Any]], torch.Tensor] | None = None,
) -> list[BlockMeasurement]:
    """Run every block of ``traced`` alone and measure it.

    ``loss``: the training loss from the graph's flat outputs (:mod:`autopipe.outputs`). The
    executor computes it on the last stage, after the last block, so its forward, backward
    and saved bytes are measured too and counted in the last block's figures.

    First the blocks run once in order, each on what the blocks before it made (its forward
    graph kept for the backward timings). Then the timing runs go round the blocks: each
    round times every block once, and a block's figure is the median of its rounds. A burst of
    other work on a shared machine then slows one round of every block alike instead of all
    the samples of one block, so the blocks keep their true proportions. A forward round is a
    real forward (:func:`_forward_round`): a block alone on inputs it has seen before, its
    output freed at once, runs 5-10% faster than inside a training forward on a CPU. B and W
    are timed as the executor runs them for zero-bubble schedules (``runtime.zerobubble``),
    which costs more than one full backward: an autograd call per group of weights.
    """
    gm = traced.gm
    param_storages = {storage_key(p) for p in gm.parameters()}
    flat = _flat_inputs(traced, inputs)
    env: dict[str, Any] = dict(zip(traced.input_names, flat, strict=True))
    runs, segments = [], []
    for block in traced.blocks:
        seg = extract(gm, block.nodes)
        segments.append(seg)
        run = _BlockRun.start(seg.module, [_leaf(env[name]) for name in seg.inputs], param_storages)
        for name, o in zip(seg.outputs, run.outs, strict=True):
            env[name] = o.detach() if isinstance(o, torch.Tensor) else o
        runs.append(run)
    out_names, _ = graph_outputs(gm)
    loss_run = (
        _LossRun.start(loss, [env[n] if n is not None else None for n in out_names], param_storages)
        if loss is not None
        else None
    )
    total = 3 * (warmup + repeat)
    samples: dict[str, list[list[float]]] = {k: [[] for _ in runs] for k in _KINDS}
    done = 0
    for kind in ("forward", "backward", "split"):
        for r in range(warmup + repeat):
            if kind == "forward":
                rows = {"forward": _forward_round(traced.input_names, segments, flat, loss, out_names)}
            elif kind == "backward":
                rows = {"backward": [_time_once(run.backward) if run.has_backward else 0.0 for run in runs]}
            else:  # B then W, as the executor splits them for zero-bubble schedules
                pairs = [run.time_split() for run in runs]
                rows = {"backward_input": [b for b, _ in pairs], "backward_weight": [w for _, w in pairs]}
            if loss_run is not None and kind != "forward":  # the loss has no weights: all B
                key = "backward" if kind == "backward" else "backward_input"
                rows[key][-1] += _time_once(loss_run.backward)
            if r >= warmup:
                for key, times in rows.items():
                    for row, t in zip(samples[key], times, strict=True):
                        row.append(t)
            done += 1
            if progress is not None:
                progress(done * len(runs) // total, len(runs))
    for p in gm.parameters():
        p.grad = None
    out = []
    for i, run in enumerate(runs):
        f, b, bi, w = (float(statistics.median(samples[k][i])) for k in _KINDS)
        extra = loss_run.saved if loss_run is not None and i == len(runs) - 1 else 0
        out.append(BlockMeasurement(f, b, bi, run.saved + extra, w))
    return out


_KINDS = ("forward", "backward", "backward_input", "backward_weight")


def _forward_round(
    input_names: Sequence[str],
    segments: Sequence[Segment],
    flat: list[Any],
    loss: Callable[[list[Any]], torch.Tensor] | None = None,
    out_names: Sequence[str | None] = (),
) -> list[float]:
    """One timed forward of the whole model, block by block, as training runs it (the loss,
    if given, counted in the last block)."""
    env: dict[str, Any] = dict(zip(input_names, flat, strict=True))
    times = []
    for seg in segments:
        args = [env[name] for name in seg.inputs]
        outs: list[Any] = []
        times.append(_time_once(lambda: outs.append(seg.module(*args))))  # noqa: B023
        env.update(zip(seg.outputs, outs[0], strict=True))
    if loss is not None:
        values = [env[n] if n is not None else None for n in out_names]
        times[-1] += _time_once(lambda: loss(values))
    return times


@dataclass
class _BlockRun:
    """One block's forward graph, kept so its backward can be timed again and again."""

    module: nn.Module
    args: list[Any]
    outs: tuple[Any, ...]
    diff: list[torch.Tensor]  # outputs that need a gradient
    grads: list[torch.Tensor]
    grad_inputs: list[torch.Tensor]  # inputs that need a gradient
    saved: int  # bytes saved for backward

    @staticmethod
    def start(module: nn.Module, args: list[Any], exclude: set[int]) -> _BlockRun:
        saved = saved_bytes(lambda: module(*args), exclude=exclude)
        outs = tuple(module(*args))
        diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
        grad_inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        return _BlockRun(module, args, outs, diff, [torch.ones_like(o) for o in diff], grad_inputs, saved)

    @property
    def has_backward(self) -> bool:
        return bool(self.diff)

    def forward(self) -> None:
        self.module(*self.args)

    def backward(self) -> None:
        torch.autograd.backward(self.diff, self.grads, retain_graph=True)

    def time_split(self) -> tuple[float, float]:
        """Seconds of B (input gradients; nothing without inputs that need one) and of W
        (the weight gradients B left), by the executor's own split (runtime.zerobubble)."""
        if not self.diff:
            return 0.0, 0.0
        from autopipe.runtime.zerobubble import backward_input

        params = [p for p in self.module.parameters() if p.requires_grad]
        held: list[Any] = []
        b = _time_once(lambda: held.append(backward_input(self.diff, self.grads, self.grad_inputs, params)))
        w = _time_once(held[0][1].run)
        return b, w


@dataclass
class _LossRun:
    """The loss on the model's outputs (as leaves), kept so its backward can be timed."""

    value: torch.Tensor
    saved: int

    @staticmethod
    def start(loss: Callable[[list[Any]], torch.Tensor], outputs: list[Any], exclude: set[int]) -> _LossRun:
        leaves = [_leaf(o) for o in outputs]
        saved = saved_bytes(lambda: loss(leaves), exclude=exclude)
        return _LossRun(loss(leaves), saved)

    def backward(self) -> None:
        if self.value.requires_grad:
            torch.autograd.backward([self.value], retain_graph=True)


def time_call(fn: Callable[[], object], warmup: int = 2, repeat: int = 5) -> float:
    """Median wall time of ``fn()`` in seconds; CUDA work is synchronised (events on a GPU)."""
    for _ in range(warmup):
        fn()
    return float(statistics.median(_time_once(fn) for _ in range(repeat)))


def _time_once(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes: CUDA events around it on a GPU, a clock on the CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def storage_key(t: torch.Tensor) -> int:
    """Identity of the storage under ``t``: equal for views of one tensor, distinct otherwise.

    The storage object's own address, not its data pointer, so meta tensors (which have no
    data) are told apart exactly as real ones are.
    """
    return int(t.untyped_storage()._cdata)


def saved_bytes(fn: Callable[[], object], exclude: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs.

    Each storage counts once (views and tensors saved twice share it); storages in
    ``exclude`` (their :func:`storage_key`; parameters: they are counted as parameters) do
    not count. Works on meta tensors too (the analytic cost model counts with it).
    """
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in exclude:
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def _leaf(v: Any) -> Any:
    """A value as a fresh autograd leaf, so a block's backward stops at its inputs."""
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.detach().requires_grad_(True)
    return v


def _flat_inputs(traced: TracedModel, inputs: Any) -> list[Any]:
    if isinstance(inputs, dict):
        ph = [n.target for n in traced.gm.graph.nodes if n.op == "placeholder"]
        return [inputs.get(str(t).lstrip("*")) for t in ph]
    if isinstance(inputs, (tuple, list)):
        return list(torch.utils._pytree.tree_leaves(list(inputs)))
    return [inputs]


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
    leaf_modules: Sequence[str],
    max_blocks: int | None,
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
            backward_weight=fit(lambda m: m.backward_weight_s, i) if all(m[i].backward_weight_s >= 0 for m in measured) else None,
            saved_bytes=fit(lambda m: float(m.saved_bytes), i),
            shared=ref.shared_params,
        )
        for i, b in enumerate(ref.blocks)
    ]
    tensors = crossing_tensors(traces)
    dtypes = {p.dtype for p in gm.parameters()}
    return Profile(
        model=str(loaded.spec),
        fingerprint=ref.fingerprint(),
        device=_device_name(dev),
        torch_version=torch.__version__,
        dtype=str(dtypes.pop()).removeprefix("torch.") if len(dtypes) == 1 else "mixed",
        micro_batch_sizes=tuple(sizes),
        method="measured",
        blocks=tuple(blocks),
        tensors=tensors,
        shared_params=ref.shared_params,
        model_file=str(loaded.spec.path),
        factory=loaded.spec.factory,
        model_kwargs=loaded.spec.kwarg_items(),
        tracer=ref.tracer,
        leaf_modules=tuple(leaf_modules),
        max_blocks=max_blocks,
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
) -> BlockCost:
    """A block's costs from its fits; parameters are the ones it owns in ``gm`` (plus, apart,
    the ``shared`` ones — ``TracedModel.shared_params`` — it uses but an earlier block owns);
    the weight-gradient part of backward is ``backward_weight`` where it was measured, else
    what the input-gradient part leaves (>= 0)."""
    owned = [gm.get_parameter(p) for p in block.params]
    borrowed = [
        gm.get_parameter(name) for name, users in shared if block.index in users and block.index != min(users)
    ]
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
    )


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
