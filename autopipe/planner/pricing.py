"""Pricing a candidate plan: per-stage costs from per-block costs, then the simulator.

A :class:`Candidate` is a decision (schedule, virtual stages, micro-batches) with its cuts;
:func:`costs_of` turns the blocks on each stage into the simulator's per-stage costs (a
recomputed stage pays one more forward in its backward and keeps only its inputs per
micro-batch in flight, plus one micro-batch's activations while it recomputes; one that
recomputes its first layers, ``partition/layers.py``, pays their forward and holds one of them
again; split in B and W, the first stage's backward is all W and a recomputed stage's all B,
as the executor runs it; every action also pays the executor's fixed cost per action,
``PlanRequest.action_overhead_s``, and an F or B that posts a send to another rank (by the
compiled schedule's placement) its cost per send on top, ``PlanRequest.send_overhead_s``
(:func:`autopipe.simulate.sends.with_send_cost`); where the schedule's sends block the sender
(``PlanRequest.blocking_sends``), a forward or backward also pays sending its output, which
then arrives as it ends), and :func:`price` runs the compiled schedule
(:func:`autopipe.simulate.events.simulate_summary`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from autopipe.costs.activations.choices import NO_CHOICE, MemoryChoice
from autopipe.costs.profile import Profile
from autopipe.partition.memo import Recent
from autopipe.partition.problem import Partition, PartitionProblem, memory_fits, stage_stats
from autopipe.schedules import schedule_spec
from autopipe.simulate.events import (
    CompiledSchedule,
    StageCost,
    Summary,
    compile_lists,
    simulate_summary,
)
from autopipe.simulate.sends import with_send_cost

__all__ = [
    "BlockTimes",
    "Candidate",
    "Decision",
    "Priced",
    "Schedules",
    "candidate",
    "compiled",
    "costs_of",
    "fits",
    "micro_batch_size",
    "price",
    "with_sends",
]


@dataclass(frozen=True)
class Decision:
    """A pipeline decision the search prices: schedule, virtual stages, micro-batches, and the
    uniform memory choice (selective recomputation, offload or the block method; costs/activations/choices.py)."""

    schedule: str
    virtual: int
    micro_batches: int
    memory: MemoryChoice = NO_CHOICE


def micro_batch_size(batch_size: int, d: Decision) -> int:
    """u = B / m: the micro-batch size of decision ``d`` (m divides B; the one place it is worked out)."""
    return batch_size // d.micro_batches


@dataclass(frozen=True)
class Candidate:
    """A decision with its cuts (a Partition) and what each stage costs."""

    decision: Decision
    source: str  # "solver", "ilp" or a baseline name
    problem: PartitionProblem
    partition: Partition
    costs: list[StageCost]  # per stage, per micro-batch
    times: BlockTimes  # the block times (and what the search keeps at this micro-batch size) they came from


class Priced(NamedTuple):
    """A candidate and what the simulator says of it (unpacks as ``c, t``)."""

    candidate: Candidate
    summary: Summary


def candidate(
    decision: Decision, source: str, problem: PartitionProblem, part: Partition, times: BlockTimes
) -> Candidate:
    costs = costs_of(problem, part, times)
    if decision.schedule in times.blocking_sends:
        costs = with_sends(costs, part.comm_s)
    if times.send_s:
        devices = problem.stages // decision.virtual
        schedule = times.schedules.compiled(decision.schedule, devices, decision.micro_batches, decision.virtual)
        costs = with_send_cost(costs, schedule.home, times.send_s)
    return Candidate(decision, source, problem, part, costs, times)


def with_sends(costs: list[StageCost], comm_s: tuple[float, ...]) -> list[StageCost]:
    """``costs`` where a send blocks its sender: each stage's forward pays sending its output to
    the next stage, its backward (its input-gradient part) the gradient to the previous one."""
    out = []
    for s, c in enumerate(costs):
        down = comm_s[s] if s < len(comm_s) else 0.0
        up = comm_s[s - 1] if s > 0 else 0.0
        out.append(
            replace(
                c, forward_s=c.forward_s + down, backward_s=c.backward_s + up, backward_input_s=c.backward_input_s + up
            )
        )
    return out


class Schedules:
    """The compiled schedules one search prices on, and what the bounds and split tables read
    of them (:func:`compiled`, ``exact.memory_rows``, ``bounds``' placements, ``exact``'s cut
    lists): made by the search and passed down with its :class:`BlockTimes`, so nothing is kept
    at module level; a BlockTimes made alone has its own, empty."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, int, int, int], CompiledSchedule] = {}
        self.rows: dict[tuple[str, int, int, int], Any] = {}  # exact.memory_rows (typed there: no import circle)
        self.placement: dict[tuple[str, int, int], tuple[npt.NDArray[np.int64], ...]] = {}
        self.cuts: dict[tuple[int, int], npt.NDArray[np.int64]] = {}

    def compiled(self, name: str, devices: int, micro_batches: int, virtual: int) -> CompiledSchedule:
        """:func:`compiled`, once per schedule."""
        key = (name, devices, micro_batches, virtual)
        hit = self._compiled.get(key)
        if hit is None:
            hit = self._compiled[key] = compiled(name, devices, micro_batches, virtual)
        return hit


@dataclass(frozen=True)
class BlockTimes:
    """Per-block times at one micro-batch size, and what the search keeps at that size: the
    search's context for one micro-batch size (one per size, shared by its decisions)."""

    f: tuple[float, ...]
    b: tuple[float, ...]
    bi: tuple[float, ...]
    w: tuple[float, ...]
    action_s: float = 0.0  # the executor's own cost per action (F, B or W), whatever its size
    send_s: float = 0.0  # and per action that posts a send to another rank, on top (candidate)
    u: int = 0  # the micro-batch size (0: not known)
    blocking_sends: tuple[str, ...] = ()  # the schedules whose sends block the sender (PlanRequest's)
    schedules: Schedules = field(default_factory=Schedules, compare=False, repr=False)  # the search's
    # The last few costs_of answers (the search bounds a split, then prices it: the same sums).
    costs: Recent[list[StageCost]] = field(default_factory=lambda: Recent(8), compare=False, repr=False)
    # What the executor holds besides the saved tensors, per block (BlockCost's, measured; () none):
    # bytes B keeps for W per micro-batch, bytes a backward makes at its peak.
    kept: tuple[float, ...] = ()
    made: tuple[float, ...] = ()

    @staticmethod
    def of(
        profile: Profile,
        u: int,
        action_s: float = 0.0,
        schedules: Schedules | None = None,
        blocking_sends: tuple[str, ...] = (),
        send_s: float = 0.0,
    ) -> BlockTimes:
        bs = profile.blocks
        return BlockTimes(
            tuple(x.forward_s(u) for x in bs),
            tuple(x.backward_s(u) for x in bs),
            tuple(x.backward_input_s(u) for x in bs),
            tuple(x.backward_weight_s(u) for x in bs),
            action_s,
            send_s,
            u,
            blocking_sends,
            Schedules() if schedules is None else schedules,
            kept=tuple(x.kept_bytes(u) for x in bs) if any(x.kept_bytes for x in bs) else (),
            made=tuple(x.backward_bytes(u) for x in bs) if any(x.backward_bytes for x in bs) else (),
        )

    @functools.cached_property
    def prefix(self) -> tuple[npt.NDArray[np.float64], ...]:
        """Prefix sums of F, B, B input-gradient and W per block (the bounds' sums)."""
        return tuple(np.concatenate(([0.0], np.cumsum(x))) for x in (self.f, self.b, self.bi, self.w))


def costs_of(problem: PartitionProblem, part: Partition, t: BlockTimes) -> list[StageCost]:
    """What each stage costs per micro-batch, recomputation included (for the simulator; the
    last few kept in ``t.costs``, by the problem's identity and the cuts' value)."""
    key = (part.stage_of_block, part.recompute)
    hit = t.costs.get((problem,), key)
    return list(t.costs.put((problem,), key, _costs_of(problem, part, t)) if hit is None else hit)


def _costs_of(problem: PartitionProblem, part: Partition, t: BlockTimes) -> list[StageCost]:
    stats = stage_stats(problem, part.stage_of_block)
    n = problem.stages
    f, b, bi, w = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    for i, s in enumerate(part.stage_of_block):
        f[s] += t.f[i]
        b[s] += t.b[i]
        bi[s] += t.bi[i]
        w[s] += t.w[i]
    costs = []
    layer_extra = stats.layer_extra or (0.0,) * n  # the block method's first layers (partition/layers.py)
    layer_peak = stats.layer_peak or (0.0,) * n
    kept, made = executor_bytes(part.stage_of_block, n, t)
    for s in range(n):
        rc = part.recompute[s]
        held = stats.in_bytes[s] if rc else stats.act[s]
        extra = f[s] if rc else layer_extra[s]
        # The first stage's inputs are the batch: no gradient to pass back, so a split
        # backward's B has nothing to compute and W is all of it. A recomputed stage's B is
        # whole and its W nothing (runtime/engine.py: W's calls would each recompute).
        first, o = s == 0 and not rc, t.action_s
        bi_s, w_s = (b[s] + extra, 0.0) if rc else (0.0, b[s] + extra) if first else (bi[s] + extra, w[s])
        costs.append(
            StageCost(
                forward_s=f[s] + o,
                backward_s=b[s] + extra + o,
                backward_input_s=bi_s + o,
                backward_weight_s=w_s + o,
                activation_bytes=held,
                weight_grad_bytes=held + (0.0 if rc else kept[s]),  # a recomputed stage's B keeps nothing
                transient_bytes=(stats.act[s] if rc else layer_peak[s]) + made[s],
                static_bytes=stats.static[s],
            )
        )
    return costs


def executor_bytes(stage_of_block: tuple[int, ...], n: int, t: BlockTimes) -> tuple[list[float], list[float]]:
    """Per stage, what the executor holds besides the saved tensors: the bytes B keeps for W per
    micro-batch (the stage's blocks' sum: held from B to W) and the bytes its backward makes at
    its peak (the largest block's: the backward runs one block after another). The first
    stage keeps nothing: its inputs are the batch, so its B computes nothing and W is the whole
    backward (``graph/split_backward.py``)."""
    kept, made = [0.0] * n, [0.0] * n
    for i, s in enumerate(stage_of_block):
        if t.kept and s > 0:
            kept[s] += t.kept[i]
        if t.made:
            made[s] = max(made[s], t.made[i])
    return kept, made


def compiled(name: str, devices: int, micro_batches: int, virtual: int) -> CompiledSchedule:
    """Schedule ``name``'s action lists, compiled for the simulator (keep it: :class:`Schedules`)."""
    # The generators are tested against the full validator; compiling re-checks the essentials.
    spec = schedule_spec(name)
    return compile_lists(spec.lists(devices, micro_batches, virtual), devices, virtual, spec.placement)


def price(c: Candidate, devices: int) -> Summary:
    """Simulate candidate ``c`` on ``devices`` devices (iteration, bubble, peak memory)."""
    d = c.decision
    schedule = c.times.schedules.compiled(d.schedule, devices, d.micro_batches, d.virtual)
    blocked = d.schedule in c.times.blocking_sends  # the sends are in the senders' times (with_sends)
    return simulate_summary(schedule, c.costs, () if blocked else c.partition.comm_s)


def fits(t: Summary, memory_limit: float) -> bool:
    """Every device's simulated peak within ``memory_limit`` (bytes per device)."""
    return all(memory_fits(m, memory_limit) for m in t.peak_memory_bytes)
