# Run: python bench/bench_breakdown.py ROW [ROW ...]   (repo root; ROW: a run name of bench/published_runs.py)
"""Where a published row's predicted step goes: one layer's time by part, and the step's (issue 24).

For each row, the pinned plan of ``bench_published.py`` (its calibration applied) and, for one
transformer layer at micro-batch size 1 on one device of the row's tensor-parallel group: the
forward and backward seconds of its GEMMs (linear layers, batched matmuls), its attention
kernels, its memory-bound ops (FLOPs 0: norms, activations, residual adds, casts, the unfused
softmax) and its tensor-parallel collectives (as exposed: ``costs.tensor.exposed``); then the
step: the pipeline's busy share, its bubble, and the data-parallel communication the step pays
past the pipeline. So an error of ``bench_published`` can be laid at the part that makes it.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_published import (
    FUSED,
    calibrated,
    counts_of,
    error,
    layout_choices,
    overlap_of,
    plan_pinned,
    predicted_figure,
)
from published_runs import RUNS, by_name

from autopipe.costs.counting import OpCount, op_dtype, op_time
from autopipe.costs.degrees import Degrees, device_ops
from autopipe.costs.devices import DeviceSpec
from autopipe.costs.fusion import fuse
from autopipe.costs.tensor import TensorSplit, block_kinds, comm_s, exposed, shape_of

PARTS = ("gemm", "attention", "memory", "tp comm")


def part_of(op: OpCount) -> str:
    """Which part of a layer's time an op is: a GEMM, attention, or a memory-bound op."""
    if op.kind == "attention":
        return "attention"
    if op.kind == "heads":
        return "memory"
    return "gemm" if op.kind in ("linear", "bmm", "grouped") else "memory"


def layer_parts(name: str, spec: DeviceSpec) -> dict[str, tuple[float, float]]:
    """part -> (forward, backward) seconds of one layer at micro-batch size 1, on one device."""
    run = by_name(name)
    counts, pin = counts_of(run), layout_choices(run)
    shape = shape_of(counts.traces[0], counts.loaded.model)
    names = [b.name for b in counts.traces[0].blocks]
    assert shape is not None, f"{name}: no transformer shape"
    i = names.index(shape.layers[0])
    split = None
    if pin.tensor_parallel > 1:
        overlap = overlap_of(run).tp_comm
        link = (spec.nvlink_bandwidth, spec.link_latency_s)
        split = TensorSplit(shape, pin.tensor_parallel, pin.sequence_parallel, *link, overlap=overlap)
    deg = Degrees(tensor=split)
    kind = block_kinds(names, shape)[i]
    count = counts.counts[0][i]
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    compute, linear = counts.precision.compute, counts.precision.linear
    for j, ops in enumerate((count.forward, count.backward)):
        for op in device_ops(fuse(ops, count.escapes, count.grads) if FUSED else ops, kind, deg):
            dtype = op_dtype(op, compute, linear)
            out[part_of(op)][j] += op_time(op, spec, spec.peak(dtype), dtype)
    if split is not None:
        tp = comm_s(kind, 1.0, split, float(counts.precision.dtype.itemsize))
        for j in (0, 1):  # the collectives as exposed beside the layer's computation
            compute = sum(out[p][j] for p in PARTS[:3])
            out["tp comm"][j] = exposed(compute, tp[j], split) - compute
    return {p: (out[p][0], out[p][1]) for p in PARTS}


def main() -> int:
    names = sys.argv[1:] or [RUNS[0].name]
    runs = [by_name(n) for n in names]
    specs, _ = calibrated(runs)
    for run in runs:
        spec = specs[run.family]
        pin = plan_pinned(run, spec).plan
        value = predicted_figure(run, pin)
        print(f"{run.name}: predicted {value:.3g} against {run.figure:.3g} {run.unit} ({error(run, value):+.1%})")
        parts = layer_parts(run.name, spec)
        f, b = sum(v[0] for v in parts.values()), sum(v[1] for v in parts.values())
        print(f"  one layer, micro-batch 1, one device: forward {f * 1e3:.2f} ms, backward {b * 1e3:.2f} ms")
        for p, (pf, pb) in parts.items():
            share = (pf + pb) / (f + b) if f + b else 0.0
            print(f"    {p:<10} forward {pf * 1e3:7.2f} ms  backward {pb * 1e3:7.2f} ms  {share:6.1%}")
        step = pin.step_time_s
        busy = pin.iteration_time_s * (1.0 - pin.bubble_fraction)
        bubble = pin.iteration_time_s * pin.bubble_fraction
        print(
            f"  step {step:.3f} s: pipeline busy {busy / step:.1%}, bubble {bubble / step:.1%}"
            f" ({pin.schedule} v{pin.virtual}, m {pin.micro_batches}, micro-batch {pin.micro_batch_size}, "
            f"{sum(s.recompute for s in pin.stages)} of {len(pin.stages)} recompute), data-parallel past the pipeline "
            f"{pin.allreduce_s / step:.1%} of {pin.dp_comm_s / step:.1%} in all ({pin.sharding}, overlap "
            f"{pin.overlap.text()})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
