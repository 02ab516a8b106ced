"""The values the tensor x pipeline x data search takes and gives: the request, a layout's plan
(an option), a split with no plan and why, the result; and the queue item and context of one
search (:mod:`autopipe.planner.parallel`).

Tests: tests/planner/test_parallel.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopipe.costs.options import Layout as Degrees
from autopipe.costs.profile import Profile
from autopipe.modes import Sharding
from autopipe.planner.cluster.sharding import NO_SHARDING, ShardOption
from autopipe.planner.placement import Cluster, Layout, layouts
from autopipe.planner.pricing import Schedules
from autopipe.planner.request import NO_CHOICES, Choices
from autopipe.planner.search import Progress, SharedCuts
from autopipe.plans import Overlap, Plan

__all__ = ["ONE", "Context", "ParallelOption", "ParallelPlan", "ParallelRequest", "Rejected", "Split"]

ONE = Degrees()  # degree 1 everywhere


@dataclass(frozen=True)
class ParallelRequest:
    """What to plan: the planner's own choices may be pinned as in ``PlanRequest``."""

    cluster: Cluster
    global_batch: int  # samples per iteration over all replicas
    memory_limit: float  # bytes per device
    bytes_per_param: float = 16.0  # weights + grads + optimizer state, per parameter
    shard_optimizer: bool = False  # pin ZeRO-1 (sharding=zero1's older name)
    stages: int | None = None  # pin S, the pipeline depth
    choices: Choices = NO_CHOICES  # pinned micro-batches (per replica), schedule, v, recomputation
    alternatives: int = 5
    action_overhead_s: float = 0.0  # the executor's cost per action (PlanRequest's)
    send_overhead_s: float = 0.0  # and per action that sends to another rank (PlanRequest's)
    tensor_parallel: int | None = None  # pin t
    data_parallel: int | None = None  # pin D
    sharding: Sharding | None = None  # pin how the state is split over the replicas (None: searched)
    shard_group: int | None = None  # pin the replicas it is split over (hybrid; None: all, or searched)
    overlap: Overlap | None = None  # what the time model overlaps (None: the target's, cluster.target_overlap)
    host_bandwidth: float = 0.0  # bytes/s to the host per device (activation offload; PlanRequest's)
    context_parallel: int | None = None  # pin cp
    expert_parallel: int | None = None  # pin ep
    expert_tensor_parallel: int | None = None  # pin etp (None: 1)
    grad_reduce_fp32: bool | None = None  # reduce the gradients in fp32 (None: as the target does bf16 weights')


@dataclass(frozen=True)
class ParallelOption:
    layout: Layout
    plan: Plan  # data_parallel, sharding and allreduce_s filled in
    sharding: ShardOption = NO_SHARDING  # as the search took it

    @property
    def step_time_s(self) -> float:
        return self.plan.step_time_s

    def describe(self) -> str:
        lay, p = self.layout, self.plan
        shards = f" over {p.shard_group}" if p.shard_group else ""
        state = f", {p.sharding}{shards}" if p.data_parallel > 1 else ""
        cp = f" x cp={lay.context_parallel}" if lay.context_parallel > 1 else ""
        etp = f" x etp={lay.expert_tensor_parallel}" if lay.expert_tensor_parallel > 1 else ""
        ep = f", ep={lay.expert_parallel}{etp}" if lay.expert_parallel * lay.expert_tensor_parallel > 1 else ""
        hidden = ", all-to-all hidden" if p.overlap.expert_comm else ""
        return (
            f"t={lay.tensor_parallel}{cp} x S={lay.stages} x D={lay.data_parallel}{ep} "
            f"({lay.placement}{state}{hidden}): "
            f"{p.schedule}, m={p.micro_batches}, "
            f"step {_seconds(p.step_time_s)} (pipeline {_seconds(p.iteration_time_s)} "
            f"+ data-parallel {_seconds(p.allreduce_s)})"
        )


def _seconds(s: float) -> str:
    return f"{s:.3f} s" if s >= 1.0 else f"{s * 1e3:.3f} ms"


@dataclass(frozen=True)
class Rejected:
    stages: int
    data_parallel: int
    reason: str  # one line
    min_memory_bytes: float | None = None  # the smallest limit that fits this (S, D), when known
    tensor_parallel: int = 1


@dataclass(frozen=True)
class ParallelPlan:
    best: ParallelOption
    runner_up: ParallelOption | None  # the best with another (t, cp, ep, etp, S)
    rejected: tuple[Rejected, ...]  # the (t, cp, S, D, ep) with no plan, and why
    pruned: int = 0  # (t, S, D) shardings skipped because their bound could not beat the runner-up

    @property
    def plan(self) -> Plan:
        return self.best.plan


@dataclass(frozen=True)
class Split:
    """A (t, cp, S, D, ep, etp) with shardings to search together, and where it stands in the queue."""

    estimate: float
    bound: float
    t: int
    S: int
    D: int
    options: tuple[ShardOption, ...]
    profile: Profile  # one device's at its degrees
    degrees: Degrees = ONE  # t, cp, ep, etp (t as above)
    hidden: Profile | None = None  # the profile with the expert all-to-all hidden, where the target can
    hidden_choices: Choices | None = None  # the choices that hide it (the schedule, no full recomputation)

    def key(self) -> tuple[float, float, int, int, int, int, int, int, bool]:
        d = self.degrees
        return self.estimate, self.bound, self.t, d.cp, self.S, self.D, d.ep, d.etp, self.hidden is not None

    def lays(self, ctx: Context) -> list[Layout]:
        """The ways its ranks can be placed on the cluster (``placement.layouts``)."""
        return layouts(self.S, self.D, ctx.request.cluster, self.t, self.degrees.cp)

    @property
    def name(self) -> tuple[Degrees, int, int, bool]:
        """What identifies it among the splits: degrees, S, D, and whether the all-to-all is hidden."""
        return self.degrees, self.S, self.D, self.hidden is not None


@dataclass(frozen=True)
class Context:
    """What every split's search shares: the request, its overlap, the schedules compiled."""

    request: ParallelRequest
    overlap: Overlap
    blocking: tuple[str, ...]  # the schedules whose sends block the sender
    sequence_parallel: bool
    schedules: Schedules
    progress: Progress | None
    partial: set[
        tuple[tuple[Degrees, int, int, bool], ShardOption]
    ]  # (Split.name, sharding) searched with a time to beat
    cuts: SharedCuts  # the pipeline searches' unlimited cuts, per profile and link
    bounds: dict[tuple[int, int, int], tuple[Profile, float]] = field(default_factory=dict)  # work bounds kept
    states: dict[tuple[int, str, int, int], tuple[Profile, Profile, float]] = field(
        default_factory=dict
    )  # state-weighted profiles kept (cluster.experts.state_profile)
    reduce_ratio: float = 1.0  # bytes a gradient reduction moves per parameter byte (placement.reduce_ratio)
