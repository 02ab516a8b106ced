"""The values the tensor x pipeline x data search takes and gives: the request, a layout's plan
(an option), a split with no plan and why, the result; and the queue item and context of one
search (:mod:`autopipe.planner.parallel`).

Tests: tests/planner/test_parallel.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopipe.costs.profile import Profile
from autopipe.modes import Sharding
from autopipe.planner.cluster.sharding import NO_SHARDING, ShardOption
from autopipe.planner.placement import Cluster, Layout
from autopipe.planner.pricing import Schedules
from autopipe.planner.request import NO_CHOICES, Choices
from autopipe.planner.search import Progress, SharedCuts
from autopipe.plans import Overlap, Plan

__all__ = ["Context", "ParallelOption", "ParallelPlan", "ParallelRequest", "Rejected", "Split"]


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
    tensor_parallel: int | None = None  # pin t
    data_parallel: int | None = None  # pin D
    sharding: Sharding | None = None  # pin how the state is split over the replicas (None: searched)
    shard_group: int | None = None  # pin the replicas it is split over (hybrid; None: all, or searched)
    overlap: Overlap | None = None  # what the time model overlaps (None: the target's, cluster.target_overlap)
    host_bandwidth: float = 0.0  # bytes/s to the host per device (activation offload; PlanRequest's)


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
        return (
            f"t={lay.tensor_parallel} x S={lay.stages} x D={lay.data_parallel} ({lay.placement}{state}): "
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
    runner_up: ParallelOption | None  # the best with another (t, S)
    rejected: tuple[Rejected, ...]  # the (t, S, D) with no plan, and why
    pruned: int = 0  # (t, S, D) shardings skipped because their bound could not beat the runner-up

    @property
    def plan(self) -> Plan:
        return self.best.plan


@dataclass(frozen=True)
class Split:
    """A (t, S, D) with shardings to search together, and where it stands in the queue."""

    estimate: float
    bound: float
    t: int
    S: int
    D: int
    options: tuple[ShardOption, ...]
    profile: Profile  # one device's at degree t

    def key(self) -> tuple[float, float, int, int, int]:
        return self.estimate, self.bound, self.t, self.S, self.D


@dataclass(frozen=True)
class Context:
    """What every split's search shares: the request, its overlap, the schedules compiled."""

    request: ParallelRequest
    overlap: Overlap
    blocking: tuple[str, ...]  # the schedules whose sends block the sender
    sequence_parallel: bool
    schedules: Schedules
    progress: Progress | None
    partial: set[tuple[int, int, int, ShardOption]]  # (t, S, D, sharding) searched with a time to beat
    cuts: SharedCuts  # the pipeline searches' unlimited cuts, per profile and link
    bounds: dict[tuple[int, int, int], tuple[Profile, float]] = field(default_factory=dict)  # work bounds kept
