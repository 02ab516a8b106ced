"""The cluster's degrees: the pinned ones checked, the cluster's fields read, tensor parallelism
priced per degree (``costs.tensor``) for the tensor x pipeline x data search.

Tests: tests/planner/test_cluster.py.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autopipe.costs.profile import Profile
from autopipe.costs.tensor import TransformerShape
from autopipe.errors import PlanError
from autopipe.planner.placement import Cluster

if TYPE_CHECKING:
    from autopipe.costs.analytic import ModelCounts
    from autopipe.costs.devices import DeviceSpec

__all__ = ["TensorOptions", "check_degrees", "cluster_fields", "tensor_options"]


@dataclass(frozen=True)
class TensorOptions:
    """Tensor parallelism for :func:`~autopipe.planner.parallel.plan_parallel`: the model's
    structure and its profile priced for one device of a t-wide group
    (``costs.analytic.profile_from_counts``)."""

    shape: TransformerShape | None
    price: Callable[[int], Profile]  # t -> one device's profile at degree t
    sequence_parallel: bool = True


def tensor_options(
    counts: ModelCounts,
    spec: DeviceSpec,
    cluster: Cluster,
    sequence_parallel: bool,
    overlap: float = 0.0,
    fused: bool = False,
) -> TensorOptions:
    """Tensor parallelism for ``counts``: its transformer structure, priced per degree t on
    ``spec`` with the collectives over ``cluster``'s NVLink, ``overlap`` of them hidden behind
    the computation (``Overlap.tp_comm``); ``fused``: memory-bound ops fused as the target
    framework runs them (``Target.fused_kernels``, ``costs.fusion``)."""
    from autopipe.costs.analytic import profile_from_counts
    from autopipe.costs.tensor import TensorSplit, shape_of

    shape = shape_of(counts.traces[0], counts.loaded.model)

    def price(t: int) -> Profile:
        split = (
            None
            if shape is None or t == 1
            else TensorSplit(shape, t, sequence_parallel, cluster.nvlink_bandwidth, cluster.link_latency_s, overlap)
        )
        return profile_from_counts(counts, spec, split, fused)

    return TensorOptions(shape, price, sequence_parallel)


def check_degrees(
    gpus: int,
    pinned: Sequence[tuple[str, int | None]],
    gpus_name: str = "gpus",
    others: Sequence[tuple[str, int | None]] = (),
) -> None:
    """The pinned degrees (``(name, value or None)``: t, S, D, then optionally cp) must multiply
    into a divisor of ``gpus`` (into ``gpus`` itself when t, S and D are all pinned); ``others``
    (ep, etp: they fold into the same devices) must be whole numbers >= 1; PlanError naming them
    as given (keywords here, flags on the command line)."""
    for name, value in [(gpus_name, gpus), *pinned, *others]:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise PlanError(f"{name} must be a whole number >= 1, not {value!r}")
    given = [(name, v) for name, v in pinned if v is not None]
    whole = all(v is not None for _, v in pinned[:3])
    product = math.prod(v for _, v in given)
    if gpus % product or (whole and product != gpus):
        said = " x ".join(f"{name} {v}" for name, v in given) + (f" = {product}" if len(given) > 1 else "")
        raise PlanError(
            f"{said} does not {'equal' if whole else 'divide'} {gpus_name} {gpus}; pin degrees whose product divides it"
        )


def cluster_fields(cluster: Mapping[str, float] | str | os.PathLike[str] | None) -> dict[str, float]:
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
