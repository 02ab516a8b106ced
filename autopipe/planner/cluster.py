"""The pure parts of planning for a cluster: the pinned degrees checked, the cluster's fields
read, tensor parallelism priced per degree, and what a sharding makes of a pipeline search.
:func:`autopipe.api.plan_cluster` composes them (model file -> counts -> the tensor x pipeline x
data-parallel search, :mod:`autopipe.planner.parallel`), as ``autopipe plan MODEL --device NAME
--gpus G`` does:

    import autopipe
    plan = autopipe.plan_cluster("models/gpt.py", kwargs={"preset": "gpt3-175b"}, device="h100",
                                 gpus=64, batch_size=1536, memory="80GB")
    plan.tensor_parallel, plan.devices, plan.data_parallel, plan.sharding   # t, p, d, ZeRO

A sharding (``planner.placement``'s formulas) changes a pipeline search in three ways: the state
each device keeps per parameter (the search's ``state_factor``), what a block gathers or reduces
per micro-batch (zero2, zero3: added to its times, :func:`sharded_profile`, hidden behind its
computation as far as the overlap allows), and what a chunk reduces and gathers once a step
(:func:`data_parallel_s`: past the pipeline's end, or overlapped with its last backward and first
forward as the simulated timeline allows, ``simulate.overlap``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from autopipe.costs.profile import Affine, BlockCost, Profile
from autopipe.costs.tensor import TransformerShape
from autopipe.errors import PlanError
from autopipe.modes import Sharding
from autopipe.planner.assemble import plan_comm, plan_costs
from autopipe.planner.placement import (
    Cluster,
    DataGroup,
    Layout,
    data_group,
    micro_comm,
    state_bytes,
    step_comm,
    transient_bytes,
)
from autopipe.planner.pricing import Schedules
from autopipe.plans import Overlap, Plan
from autopipe.schedules.targets import SHARDINGS, target_spec
from autopipe.simulate.overlap import chunk_windows, exposed_s

if TYPE_CHECKING:
    from autopipe.costs.analytic import ModelCounts
    from autopipe.costs.devices import DeviceSpec

__all__ = [
    "NO_SHARDING",
    "ShardOption",
    "TensorOptions",
    "check_degrees",
    "cluster_fields",
    "data_parallel_s",
    "element_bytes",
    "group_of",
    "least_step_comm",
    "restamp",
    "shard_options",
    "sharded_profile",
    "state_factor",
    "target_overlap",
    "tensor_options",
    "transient",
    "with_transient",
]


@dataclass(frozen=True)
class TensorOptions:
    """Tensor parallelism for :func:`~autopipe.planner.parallel.plan_parallel`: the model's
    structure and its profile priced for one device of a t-wide group
    (``costs.analytic.profile_from_counts``)."""

    shape: TransformerShape | None
    price: Callable[[int], Profile]  # t -> one device's profile at degree t
    sequence_parallel: bool = True


def tensor_options(
    counts: ModelCounts, spec: DeviceSpec, cluster: Cluster, sequence_parallel: bool, overlap: float = 0.0
) -> TensorOptions:
    """Tensor parallelism for ``counts``: its transformer structure, priced per degree t on
    ``spec`` with the collectives over ``cluster``'s NVLink, ``overlap`` of them hidden behind
    the computation (``Overlap.tp_comm``)."""
    from autopipe.costs.analytic import profile_from_counts
    from autopipe.costs.tensor import TensorSplit, shape_of

    shape = shape_of(counts.traces[0], counts.loaded.model)

    def price(t: int) -> Profile:
        split = (
            None
            if shape is None or t == 1
            else TensorSplit(shape, t, sequence_parallel, cluster.nvlink_bandwidth, cluster.link_latency_s, overlap)
        )
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
            f"{said} does not {'equal' if len(given) == 3 else 'divide'} {gpus_name} {gpus}; "
            "pin degrees whose product divides it"
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


# --------------------------------------------------------------------------- sharding


def target_overlap(target: str, overlap: Overlap | None = None) -> Overlap:
    """``overlap``, or where None what ``target`` overlaps by default (``Target.overlaps``)."""
    if overlap is not None:
        return overlap
    runs = target_spec(target).overlaps
    return Overlap(grad_reduce="grad_reduce" in runs, param_gather="param_gather" in runs, p2p="p2p" in runs)


@dataclass(frozen=True)
class ShardOption:
    """A sharding the search may take: over all of a stage's replicas, over a node's (``node``:
    hybrid), or over ``group`` of them (pinned)."""

    kind: Sharding
    node: bool = False
    group: int | None = None

    @property
    def per_step(self) -> bool:
        """Whether it communicates once a step only (the blocks' times stay as profiled)."""
        return self.kind not in (Sharding.ZERO2, Sharding.ZERO3)

    def shards(self, lay: Layout) -> int | None:
        """N, the replicas the state is split over on ``lay``; None where it does not apply."""
        D = lay.data_parallel
        if self.kind == Sharding.NONE or (self.group is None and not self.node):
            return D
        n = self.group if self.group is not None else lay.node_replicas
        return n if 1 < n < D and D % n == 0 else None

    def rank(self) -> tuple[int, bool]:
        """Preference among options that tie: less sharded first, over all replicas first."""
        return SHARDINGS.index(self.kind.value), self.node or self.group is not None


NO_SHARDING = ShardOption(Sharding.NONE)


def shard_options(
    target: str, stages: int, replicas: int, pinned: Sharding | None, group: int | None
) -> tuple[list[ShardOption], str]:
    """The shardings to search for ``replicas`` replicas of a ``stages``-deep pipeline (with ``pinned``
    and ``group`` as the user pinned them), and why there are none ('' when there are)."""
    spec = target_spec(target)
    allowed = spec.sharding_choices(stages)
    if replicas == 1:
        return [ShardOption(Sharding.NONE)], ""
    if pinned is not None:
        if pinned.value not in allowed:
            where = "with a pipeline" if stages > 1 else "without a pipeline"
            return [], f"--sharding {pinned}: {spec.label} runs {' or '.join(allowed)} {where}"
        kinds = [pinned]
    else:  # zero3-step prices as zero1 (its memory, its collectives): searched where zero1 is not run
        kinds = [Sharding(k) for k in allowed if not (k == "zero3-step" and "zero1" in allowed)]
    if group is not None:
        if replicas % group or not 1 < group < replicas:
            return [], f"--shard-group {group} does not divide {replicas} replicas into groups of 2 or more"
        return [ShardOption(k, group=group) for k in kinds if k != Sharding.NONE], ""
    return [ShardOption(k) for k in kinds] + [ShardOption(k, node=True) for k in kinds if k != Sharding.NONE], ""


def element_bytes(profile: Profile) -> float:
    """Bytes of one stored parameter element (4 without parameters)."""
    params = sum(b.params for b in profile.blocks)
    return sum(b.param_bytes for b in profile.blocks) / params if params else 4.0


def state_factor(profile: Profile, bytes_per_param: float, kind: Sharding, shards: int) -> float:
    """Bytes a device keeps per byte of parameters (the search's ``state_factor``)."""
    elt = element_bytes(profile)
    return state_bytes(kind, shards, bytes_per_param, elt) / elt


def transient(profile: Profile, kind: Sharding) -> float:
    """Bytes gathered or not yet reduced while the largest block runs (``placement.transient_bytes``)."""
    return transient_bytes(kind, max((b.param_bytes for b in profile.blocks), default=0))


@dataclass(frozen=True)
class _WithComm(Affine):
    """A block's time with its collectives per micro-batch: ``serial`` adds whole, ``hidden``
    only where it outlasts the computation."""

    serial: float = 0.0
    hidden: float = 0.0

    def __call__(self, u: float) -> float:
        compute = self.intercept + self.slope * u
        return compute + self.serial + max(0.0, self.hidden - compute)


def _with_comm(cost: Affine, gather: float, reduce: float, overlap: Overlap) -> Affine:
    """``cost`` with ``gather`` and ``reduce`` per micro-batch; ``cost`` itself where they add
    nothing (none, or hidden behind even a micro-batch of one)."""
    serial = (0.0 if overlap.param_gather else gather) + (0.0 if overlap.grad_reduce else reduce)
    hidden = gather + reduce - serial
    if serial == 0.0 and hidden <= cost(1.0):
        return cost
    return _WithComm(cost.intercept, cost.slope, serial, hidden)


def sharded_profile(profile: Profile, kind: Sharding, group: DataGroup, overlap: Overlap) -> Profile:
    """``profile`` with each block's per-micro-batch collectives under ``kind`` in its times (zero3:
    the weights gathered in the forward and the input-gradient backward, the gradients
    reduce-scattered after the weight-gradient one; zero2 that reduce-scatter only); ``profile``
    itself where they change no block's time."""

    def one(b: BlockCost) -> BlockCost:
        gather, reduce = micro_comm(kind, group, b.param_bytes)
        return replace(
            b,
            forward_s=_with_comm(b.forward_s, gather, 0.0, overlap),
            backward_s=_with_comm(b.backward_s, gather, reduce, overlap),
            backward_input_s=_with_comm(b.backward_input_s, gather, 0.0, overlap),
            backward_weight_s=_with_comm(b.backward_weight_s, 0.0, reduce, overlap),
        )

    if kind not in (Sharding.ZERO2, Sharding.ZERO3):
        return profile
    blocks = tuple(one(b) for b in profile.blocks)
    if all(b == a for a, b in zip(profile.blocks, blocks, strict=True)):
        return profile  # every collective hidden: the blocks' times as profiled (the same object: searches share it)
    return replace(profile, blocks=blocks)


def least_step_comm(profile: Profile, stages: int, kind: Sharding, group: DataGroup, overlap: Overlap) -> float:
    """A lower bound on what the once-a-step collectives add to any plan of ``stages`` devices: the
    average device's, where they do not overlap (nothing where they do)."""
    reduce, gather = step_comm(kind, group, sum(b.param_bytes for b in profile.blocks) / stages)
    return (0.0 if overlap.grad_reduce else reduce) + (0.0 if overlap.param_gather else gather)


def data_parallel_s(
    plan: Plan, kind: Sharding, group: DataGroup, element: float, overlap: Overlap, schedules: Schedules
) -> tuple[float, float]:
    """(past the pipeline, in all) seconds of ``plan``'s once-a-step data-parallel collectives on
    its busiest device: serial, each device's chunks as one collective after its pipeline (or
    before, the gathers); overlapped, chunk by chunk on the simulated timeline (``simulate.overlap``)."""
    if group.replicas == 1:
        return 0.0, 0.0
    per_device: dict[int, float] = {}
    for s in plan.stages:
        per_device[s.rank] = per_device.get(s.rank, 0.0) + s.params * element
    whole = max(sum(step_comm(kind, group, nbytes)) for nbytes in per_device.values())
    if not (overlap.grad_reduce or overlap.param_gather):
        return whole, whole
    chunks = [step_comm(kind, group, s.params * element) for s in plan.stages]
    compiled = schedules.compiled(plan.schedule, plan.devices, plan.micro_batches, plan.virtual)
    windows = chunk_windows(compiled, plan_costs(plan), plan_comm(plan))
    reduce, gather = [c[0] for c in chunks], [c[1] for c in chunks]
    out = exposed_s(windows, reduce, gather, overlap_reduce=overlap.grad_reduce, overlap_gather=overlap.param_gather)
    if not overlap.grad_reduce:  # the serial part as one collective per device, as above
        out = max(out, max(step_comm(kind, group, nbytes)[0] for nbytes in per_device.values()))
    return out, whole


def restamp(plan: Plan, ratio: float, limit: float) -> Plan | None:
    """``plan`` with every device's state ``ratio`` times as large (a sharding that keeps more per
    parameter), or None where that does not fit ``limit``: the same cuts are then the best of the
    sharding that keeps more, since whatever fits it fits the one that keeps less."""
    extra = [0.0] * plan.devices
    for s in plan.stages:
        extra[s.rank] += s.static_bytes * (ratio - 1.0)
    peak = tuple(p + e for p, e in zip(plan.peak_memory_bytes, extra, strict=True))
    if any(p > limit * (1 + 1e-12) for p in peak):
        return None
    stages = tuple(
        replace(s, static_bytes=s.static_bytes * ratio, memory_bytes=s.memory_bytes + s.static_bytes * (ratio - 1.0))
        for s in plan.stages
    )
    most = max(extra, default=0.0)
    baselines = tuple(
        replace(
            b,
            peak_memory_bytes=tuple(p + e for p, e in zip(b.peak_memory_bytes, extra, strict=True)),
            fits=all(p + e <= limit for p, e in zip(b.peak_memory_bytes, extra, strict=True)),
        )
        for b in plan.baselines
    )
    alternatives = tuple(replace(a, peak_memory_bytes=a.peak_memory_bytes + most) for a in plan.alternatives)
    alternatives = tuple(a for a in alternatives if a.peak_memory_bytes <= limit)
    return replace(plan, stages=stages, peak_memory_bytes=peak, baselines=baselines, alternatives=alternatives)


def with_transient(plan: Plan, nbytes: float, limit: float) -> Plan:
    """``plan`` (searched within ``limit - nbytes``) with ``nbytes`` more on every device, and ``limit``."""
    if nbytes == 0.0 and plan.memory_limit_bytes == limit:
        return plan
    return replace(
        plan,
        memory_limit_bytes=limit,
        peak_memory_bytes=tuple(p + nbytes for p in plan.peak_memory_bytes),
        stages=tuple(replace(s, memory_bytes=s.memory_bytes + nbytes) for s in plan.stages),
        baselines=tuple(
            replace(b, peak_memory_bytes=tuple(p + nbytes for p in b.peak_memory_bytes)) for b in plan.baselines
        ),
        alternatives=tuple(replace(a, peak_memory_bytes=a.peak_memory_bytes + nbytes) for a in plan.alternatives),
    )


def group_of(option: ShardOption, lay: Layout, cluster: Cluster) -> DataGroup | None:
    """The data-parallel group ``option`` shards on ``lay``; None where it does not apply."""
    n = option.shards(lay)
    return None if n is None else data_group(lay, cluster, n)
