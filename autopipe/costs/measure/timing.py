"""Run each block of a traced model alone and measure it: time, and bytes saved for backward.

The measuring half of the profiler (:mod:`autopipe.costs.measure.measured` traces, fits and assembles the
Profile). Times: CUDA events with synchronisation on a GPU, ``time.perf_counter`` on the CPU;
saved bytes: ``torch.autograd.graph.saved_tensors_hooks``, every storage once, parameters
excluded. :func:`measure_blocks` says how the rounds go.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autopipe.graph.live_bytes import TensorBytes
from autopipe.graph.outputs import graph_outputs
from autopipe.graph.segment import Segment, extract
from autopipe.graph.trace import TracedModel

__all__ = [
    "BlockMeasurement",
    "backward_bytes",
    "flat_inputs_of",
    "measure_blocks",
    "relative_spread",
    "saved_bytes",
    "storage_key",
    "time_call",
]


@dataclass(frozen=True)
class BlockMeasurement:
    """One block at one micro-batch size."""

    forward_s: float
    backward_s: float
    backward_input_s: float
    saved_bytes: int
    backward_weight_s: float = -1.0  # measured W of a split backward; < 0: B - B_input
    # The samples' spread (:func:`relative_spread`) of F, B, B input-gradient and W, each over its median.
    spread: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    kept_bytes: int = 0  # what a split backward's B keeps for W besides the saved tensors (TensorBytes)
    backward_bytes: int = 0  # what a whole backward makes at its peak besides them (TensorBytes)


def relative_spread(samples: Sequence[float]) -> float:
    """How far the median of ``samples`` may be off, as a fraction of it: the interquartile
    range of the samples over the square root of their count (about the median's standard
    error: 1.2533 σ/√n with σ ≈ IQR/1.349) over the median. 0 for fewer than two samples or a
    zero median. Quartiles by linear interpolation (``statistics.quantiles``' ``inclusive``)."""
    if len(samples) < 2:
        return 0.0
    mid = statistics.median(samples)
    if mid <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return float(max(0.0, q3 - q1) / math.sqrt(len(samples)) / mid)


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

    ``loss``: the training loss from the graph's flat outputs (:mod:`autopipe.graph.outputs`). The
    executor computes it on the last stage, after the last block, so its forward, backward
    and saved bytes are measured too and counted in the last block's figures.

    First the blocks run once in order, each on what the blocks before it made (its forward
    graph kept for the backward timings). Then the timing runs go round the blocks: each
    round times every block once, and a block's figure is the median of its rounds (its spread:
    how far that median may be off, :func:`relative_spread`). A burst of
    other work on a shared machine then slows one round of every block alike instead of all
    the samples of one block, so the blocks keep their true proportions. A forward round is a
    real forward (:func:`_forward_round`): a block alone on inputs it has seen before, its
    output freed at once, runs 5-10% faster than inside a training forward on a CPU. B and W
    are timed as the executor runs them for zero-bubble schedules (``runtime.zerobubble``),
    which costs more than one full backward: an autograd call per group of weights.
    """
    gm = traced.gm
    param_storages = {storage_key(p) for p in gm.parameters()}
    flat = flat_inputs_of(traced, inputs)
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
    kept, made = _held_bytes(runs, loss_run)
    for p in gm.parameters():
        p.grad = None
    out = []
    for i, run in enumerate(runs):
        f, b, bi, w = (float(statistics.median(samples[k][i])) for k in _KINDS)
        extra = loss_run.saved if loss_run is not None and i == len(runs) - 1 else 0
        spread = tuple(relative_spread(samples[k][i]) for k in _KINDS)
        out.append(
            BlockMeasurement(
                f, b, bi, run.saved + extra, w, (spread[0], spread[1], spread[2], spread[3]), kept[i], made[i]
            )
        )
    return out


_KINDS = ("forward", "backward", "backward_input", "backward_weight")


def _held_bytes(runs: Sequence[_BlockRun], loss_run: _LossRun | None) -> tuple[list[int], list[int]]:
    """Per block, what a split backward's B keeps for W and what a backward adds at its peak
    (the loss's, which runs first in the last block's backward, counted there)."""
    kept = [run.kept_bytes() for run in runs]
    made = [run.backward_bytes() for run in runs]
    if loss_run is not None and runs:
        made[-1] = max(made[-1], loss_run.backward_bytes())
    return kept, made


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

    def backward_bytes(self) -> int:
        """What the block's backward adds at its peak (:func:`backward_bytes`)."""
        return backward_bytes(lambda: tuple(self.module(*self.args))) if self.diff else 0

    def kept_bytes(self) -> int:
        """Bytes the executor's B (``graph.split_backward``) keeps for W besides the saved tensors:
        the gradients at the weight ops' outputs; the input gradients it returns are sent on."""
        if not self.diff:
            return 0
        from autopipe.graph.split_backward import backward_input

        params = [p for p in self.module.parameters() if p.requires_grad]
        counter = TensorBytes()
        with counter:  # the seeds made inside: in a stage they are made by B (the next block's
            # input gradients, the loss's) or received, and W holds those it restarts from
            seeds = [torch.ones_like(g) for g in self.grads]
            grads, weight = backward_input(self.diff, seeds, self.grad_inputs, params)
            del grads, seeds
        kept = counter.live
        del weight
        return kept

    def time_split(self) -> tuple[float, float]:
        """Seconds of B (input gradients; nothing without inputs that need one) and of W
        (the weight gradients B left), by the executor's own split (runtime.zerobubble)."""
        if not self.diff:
            return 0.0, 0.0
        from autopipe.graph.split_backward import backward_input

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
    again: Callable[[], torch.Tensor]  # the loss computed anew (a graph of its own)

    @staticmethod
    def start(loss: Callable[[list[Any]], torch.Tensor], outputs: list[Any], exclude: set[int]) -> _LossRun:
        leaves = [_leaf(o) for o in outputs]
        saved = saved_bytes(lambda: loss(leaves), exclude=exclude)
        return _LossRun(loss(leaves), saved, lambda: loss(leaves))

    def backward(self) -> None:
        if self.value.requires_grad:
            torch.autograd.backward([self.value], retain_graph=True)

    def backward_bytes(self) -> int:
        """What the loss's backward adds at its peak (:func:`backward_bytes`)."""
        return backward_bytes(lambda: (self.again(),))


def backward_bytes(forward: Callable[[], Sequence[Any]]) -> int:
    """Live bytes a training backward adds at its peak over what its forward left: the gradients
    flowing through, a weight's gradient before it is added into ``.grad`` (counted after a
    first backward made ``.grad``, as every micro-batch's but the first), less the saved tensors
    it frees on the way. ``forward()`` runs anew (a graph of its own) and gives the outputs."""
    counter = TensorBytes()
    with counter:
        diff = [o for o in forward() if isinstance(o, torch.Tensor) and o.requires_grad]
        if not diff:
            return 0
        seeds = [torch.ones_like(o) for o in diff]  # the received gradients: there before B
        base = counter.peak = counter.live
        torch.autograd.backward(diff, seeds)
    return max(0, counter.peak - base)


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


def flat_inputs_of(traced: TracedModel, inputs: Any) -> list[Any]:
    if isinstance(inputs, dict):
        ph = [n.target for n in traced.gm.graph.nodes if n.op == "placeholder"]
        return [inputs.get(str(t).lstrip("*")) for t in ph]
    if isinstance(inputs, (tuple, list)):
        return list(torch.utils._pytree.tree_leaves(list(inputs)))
    return [inputs]
