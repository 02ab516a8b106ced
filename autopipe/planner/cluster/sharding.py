"""What a sharding of the data-parallel state makes of a pipeline search (``placement``'s formulas):
which shardings a target runs, the state each device keeps per parameter (the search's
``state_factor``), what is gathered beside it while a block runs, and what a block gathers and
reduces each micro-batch (zero2, zero3), added to its times as far as the overlap leaves them
showing; the defaults of what overlaps, by target, and the buckets its once-a-step collectives
go out in (``ddp_buckets``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from autopipe.costs.profile import Affine, BlockCost, Profile
from autopipe.modes import Sharding
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
from autopipe.plans import Overlap, Plan
from autopipe.schedules.targets import SHARDINGS, target_spec
from autopipe.simulate.overlap import Buckets

__all__ = [
    "NO_SHARDING",
    "ShardOption",
    "ddp_buckets",
    "element_bytes",
    "group_of",
    "least_step_comm",
    "shard_options",
    "sharded_profile",
    "state_factor",
    "target_overlap",
    "transient",
]


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


def state_factor(
    profile: Profile, bytes_per_param: float, kind: Sharding, shards: int, grad_ratio: float = 1.0
) -> float:
    """Bytes a device keeps per byte of parameters (the search's ``state_factor``); ``grad_ratio``:
    the gradients' bytes per weight byte (``placement.state_bytes``)."""
    elt = element_bytes(profile)
    return state_bytes(kind, shards, bytes_per_param, elt, grad_ratio) / elt


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


def group_of(option: ShardOption, lay: Layout, cluster: Cluster, reduce_ratio: float = 1.0) -> DataGroup | None:
    """The data-parallel group ``option`` shards on ``lay`` (its gradients reduced at
    ``reduce_ratio`` bytes per parameter byte); None where it does not apply."""
    n = option.shards(lay)
    return None if n is None else data_group(lay, cluster, n, reduce_ratio)


def ddp_buckets(plan: Plan, kind: Sharding, replicas: int) -> Buckets | None:
    """The buckets ``plan``'s target cuts its DDP or distributed-optimizer collectives into
    (``Target.ddp_buckets``); None where they stream (or the sharding is another)."""
    rule = target_spec(plan.target).ddp_buckets
    if rule is None or kind not in (Sharding.NONE, Sharding.ZERO1):
        return None
    params, ranks = [s.params for s in plan.stages], [s.rank for s in plan.stages]
    reduce, gather = rule.counts(params, ranks, replicas, plan.virtual > 1)
    return Buckets(reduce, gather)
