"""Planning a model file for a cluster from Python, as ``autopipe plan MODEL --device NAME
--gpus G`` does: the model built on the meta device and counted (no weights allocated), priced
on a catalogue device, then the tensor x pipeline x data-parallel search.

    import autopipe
    plan = autopipe.plan_cluster("models/gpt.py", kwargs={"preset": "gpt3-175b"}, device="h100",
                                 gpus=64, batch_size=1536, memory="80GB")
    plan.tensor_parallel, plan.devices, plan.data_parallel      # t, p, d

Every argument the command line pins (``--tensor-parallel``, ``--stages``, ``--data-parallel``,
``--micro-batches``, ``--schedule``, ...) is a keyword here; ``cluster`` overrides the
catalogue device's nodes and links (a ``--cluster`` JSON file, or its fields as a mapping).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from autopipe.errors import PlanError
from autopipe.planner.parallel import TensorOptions, plan_parallel
from autopipe.planner.placement import Cluster
from autopipe.plans import Plan

if TYPE_CHECKING:
    from autopipe.costs.analytic import ModelCounts
    from autopipe.costs.devices import DeviceSpec
    from autopipe.costs.profile import Profile
    from autopipe.graph.recipe import TraceRecipe
    from autopipe.planner.search import Progress

__all__ = ["check_degrees", "count_for_plan", "plan_cluster", "tensor_options"]


def count_for_plan(
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
    from autopipe.costs.analytic import count_model
    from autopipe.graph.recipe import TraceRecipe
    from autopipe.model.load import load_model
    from autopipe.planner.defaults import ANALYTIC_MICRO_BATCH_SIZES, default_dtype

    loaded = load_model(str(model), dict(kwargs or {}), device="meta")
    return count_model(
        loaded, micro_batch_sizes=tuple(micro_batch_sizes or ANALYTIC_MICRO_BATCH_SIZES),
        dtype=dtype or default_dtype(spec), recipe=recipe or TraceRecipe(), progress=progress, shallow=True,
    )  # fmt: skip


def tensor_options(counts: ModelCounts, spec: DeviceSpec, cluster: Cluster, sequence_parallel: bool) -> TensorOptions:
    """Tensor parallelism for ``counts``: its transformer structure, priced per degree t on
    ``spec`` with the collectives over ``cluster``'s NVLink."""
    from autopipe.costs.analytic import profile_from_counts
    from autopipe.costs.tensor import TensorSplit, shape_of

    shape = shape_of(counts.traces[0], counts.loaded.model)

    def price(t: int) -> Profile:
        split = None if shape is None or t == 1 else TensorSplit(shape, t, sequence_parallel, cluster.nvlink_bandwidth, cluster.link_latency_s)
        return profile_from_counts(counts, spec, split)

    return TensorOptions(shape, price, sequence_parallel)


def check_degrees(gpus: int, pinned: Sequence[tuple[str, int | None]], gpus_name: str = "gpus") -> None:
    """The pinned degrees (``(name, value or None)``: t, S, D) must multiply into a divisor of
    ``gpus`` (into ``gpus`` itself when all three are pinned); PlanError naming them as given
    (keywords here, flags on the command line)."""
    for name, value in [(gpus_name, gpus), *pinned]:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise PlanError(f"{name} must be a whole number >= 1, not {value!r}")
    given = [(name, v) for name, v in pinned if v is not None]
    product = math.prod(v for _, v in given)
    if gpus % product or (len(given) == 3 and product != gpus):
        said = " x ".join(f"{name} {v}" for name, v in given) + (f" = {product}" if len(given) > 1 else "")
        raise PlanError(
            f"{said} does not {'equal' if len(given) == 3 else 'divide'} {gpus_name} {gpus}; pin degrees whose product divides it"
        )


def _cluster_fields(cluster: Mapping[str, float] | str | os.PathLike[str] | None) -> dict[str, float]:
    from autopipe.costs.devices import CLUSTER_KEYS, read_cluster_file

    if cluster is None:
        return {}
    if isinstance(cluster, (str, os.PathLike)):
        return read_cluster_file(Path(cluster))
    fields = {CLUSTER_KEYS[k][0] if k in CLUSTER_KEYS else k: v for k, v in cluster.items()}
    known = set(Cluster.__dataclass_fields__) - {"devices"}
    wrong = sorted(set(fields) - known)
    if wrong:
        raise PlanError(f"cluster has no field {wrong[0]!r}; use {', '.join(CLUSTER_KEYS)}")
    return fields


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
    micro_batches: int | None = None,
    schedule: str | None = None,
    virtual: int | None = None,
    recompute: str = "auto",
    zero1: bool = False,
    sequence_parallel: bool = True,
    cluster: Mapping[str, float] | str | os.PathLike[str] | None = None,
    dtype: str | None = None,
    device_files: Sequence[str | Path] = (),
    calibration: str | Path | None = None,
    progress: Progress | None = None,
) -> Plan:
    """The plan ``autopipe plan model --device DEVICE --gpus GPUS ...`` writes (same search, same
    plan): ``device`` a catalogue name (``h100``, ``a100-80gb``, ...), ``memory`` per device
    (default: the device's), ``batch_size`` the global batch. PlanError (one line) for pinned
    degrees that cannot split ``gpus`` or a request nothing fits."""
    from autopipe.costs.analytic import profile_from_counts
    from autopipe.costs.calibrate import stored_calibration
    from autopipe.costs.devices import device_spec
    from autopipe.planner.defaults import parallel_request
    from autopipe.units import parse_bytes

    check_degrees(gpus, [("tensor_parallel", tensor_parallel), ("stages", stages), ("data_parallel", data_parallel)])
    fields = _cluster_fields(cluster)
    spec = stored_calibration(device_spec(device, device_files), calibration)
    counts = count_for_plan(model, kwargs, spec, dtype=dtype, progress=progress)
    profile = profile_from_counts(counts, spec)
    request = parallel_request(
        profile, gpus=gpus, stages=stages, batch_size=batch_size,
        memory_limit=None if memory is None else parse_bytes(memory, "memory"), micro_batches=micro_batches,
        schedule=schedule, virtual=virtual, recompute=recompute, device=spec, device_files=device_files, shard_optimizer=zero1,
    )  # fmt: skip
    layout = replace(request.cluster, **fields)  # type: ignore[arg-type]
    request = replace(request, cluster=layout, tensor_parallel=tensor_parallel, data_parallel=data_parallel)
    tensor = tensor_options(counts, spec, layout, sequence_parallel)
    return plan_parallel(profile, request, progress, tensor).plan
