"""The partition problem, its result, and :func:`evaluate`, the one definition every solver uses.

Numbers in, partition out: no torch here. Blocks are given in a topological order; a
:class:`PartitionProblem` asks to cut them into ``S`` pipeline stages (costs are per
micro-batch). Definitions, exactly as every solver and test uses them:

- An assignment gives each block a stage in [0, S); it must be monotone along every tensor
  (stage(src) <= stage(d) for all d) and leave no stage empty. Chain solvers restrict to
  CONTIGUOUS ranges of the given order (for a chain, monotone == contiguous).
- cut c (0 <= c < S-1) lies between stage c and c+1. cut_bytes(c) = sum of bytes of tensors
  with src >= 0, stage(src) <= c < max(stage(d) for d in dsts) (a tensor crossing several cuts
  is carried over each and priced on each). comm_s(c) = link_latency_s +
  cut_bytes(c)/link_bandwidth if cut_bytes(c) > 0 else 0.
- in_bytes(s) = sum of bytes of tensors consumed by some block in stage s and produced outside
  it (stage(src) < s, or src == -1).
- stage time T_s = sum time_s over its blocks (+ sum recompute_s over its blocks if the stage
  recomputes).
- stage memory without recompute: sum static + inflight[s] * sum activation; with recompute:
  sum static + inflight[s] * in_bytes(s) + sum activation (one micro-batch re-materialised in
  its backward).
- the block method (``recompute_layers`` k > 0, mode "never"): the first k blocks flagged in
  ``layers`` of every stage are recomputed whole (``partition/layers.py``): the stage's time
  gains their recompute_s, its activations lose what they no longer keep (activation less
  their own inputs) and its memory gains the largest of their activations once.
- feasible: memory_s <= stage_memory_limit[s] for all s (relative epsilon :data:`EPS` = 1e-9:
  ``memory <= memory_cap(limit) = limit * (1 + EPS)``, :func:`memory_fits`; the one rule
  every solver, screen and the simulator's check use, each with a named tolerance).
- objective, lexicographic: first Z = max(max_s T_s, max_c comm_s(c)) (the pipeline's
  bottleneck), then total = sum_s T_s + sum_c comm_s(c), then fewer recomputed stages. Floats
  compare with relative tolerance 1e-9.

A tensor with no consumers (``dsts == ()``) crosses no cut and is nobody's input. In "auto"
recompute mode the best choice for a given assignment is per stage and needs no search: not
recomputing is never slower, so a stage recomputes exactly when its activations do not fit
otherwise but its inputs do (:func:`evaluate` with ``recompute=None`` applies that rule).
The memory model is the checkpointing trade of GPipe (Huang et al., 2019) under the 1F1B
in-flight counts of PipeDream-Flush (Narayanan et al., 2021).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from autopipe.errors import PlanError
from autopipe.partition.layers import stage_terms
from autopipe.partition.memo import BlockMemo
from autopipe.partition.stage_sums import Flat, flat_of, stage_sums

__all__ = ["EPS", "SCREEN_SLACK", "Edge", "Partition", "PartitionProblem", "evaluate", "memory_cap", "memory_fits"]

EPS = 1e-9
"""Relative tolerance for memory limits and for comparing objective values (the C probe,
``_probe.c``, takes its caps from :func:`memory_cap` with this tolerance:
``partition._intervals.stage_caps``)."""

SCREEN_SLACK = 1e-6
"""The wider tolerance of the screens before the simulator (``planner.splits.plain_may_fit``,
``planner.exact.split_table``, ``planner.bounds.split_bound``): a split is screened out only
when its least or exact peak exceeds a device's limit by more than this (relative); the
simulator's peak under :func:`memory_fits` has the last word on the others."""

RECOMPUTE_MODES = ("never", "always", "auto")


NumberOrArray = TypeVar("NumberOrArray", float, npt.NDArray[np.float64])


def memory_cap(limit: NumberOrArray, tolerance: float = EPS) -> NumberOrArray:
    """The largest memory that still fits ``limit`` (a number or an array of them; inf allowed):
    the one "fits in memory" rule is ``memory <= memory_cap(limit)``, ``tolerance`` relative
    (:data:`EPS` for the rule itself, :data:`SCREEN_SLACK` for the screens)."""
    return limit * (1.0 + tolerance)


def memory_fits(memory: float, limit: float, tolerance: float = EPS) -> bool:
    """``memory <= limit`` up to the relative ``tolerance`` (``limit`` may be inf)."""
    return memory <= memory_cap(limit, tolerance)


@dataclass(frozen=True)
class Edge:
    """A tensor flowing between blocks (an edge of the block graph; not a torch.Tensor)."""

    src: int  # producing block, -1 = a model input (fed locally to any stage, never crosses a link)
    dsts: tuple[int, ...]  # consuming blocks, each > src
    bytes: float  # size at the micro-batch size in question


@dataclass(frozen=True)
class PartitionProblem:
    """Cut n blocks (given in a topological order) into S stages; everything per micro-batch."""

    time_s: tuple[float, ...]  # per block forward+backward time
    recompute_s: tuple[float, ...]  # per block extra time if its stage recomputes (forward time)
    static_bytes: tuple[float, ...]  # per block params + grads + optimizer state
    activation_bytes: tuple[float, ...]  # per block bytes saved for backward, one micro-batch
    tensors: tuple[Edge, ...]
    stages: int
    inflight: tuple[float, ...]  # per stage k_s: micro-batches whose activations it holds at peak
    # Per stage, bytes (math.inf allowed). A stage is one chunk of the model: with v virtual
    # stages per device, the planner cuts S·v stages and gives each a device's limit / v.
    stage_memory_limit: tuple[float, ...]
    link_latency_s: float = 0.0
    link_bandwidth: float = math.inf  # bytes/s
    recompute: str = "auto"  # "never" | "always" | "auto" (choose per stage)
    # The block method (partition/layers.py): the blocks that are layers, and how many of each
    # stage's first layers are recomputed whole (0: none; then recompute is "never").
    layers: tuple[bool, ...] = ()
    recompute_layers: int = 0
    # What the kernels may keep of these blocks across problems on the same tuples (the
    # planner makes one per micro-batch size; None: nothing kept). Not part of the problem.
    memo: BlockMemo | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def blocks(self) -> int:
        return len(self.time_s)


def _check_numbers(name: str, values: Sequence[float], allow_inf: bool = False) -> None:
    for i, v in enumerate(values):
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if math.isnan(x) or x < 0 or (math.isinf(x) and not allow_inf):
            kind = "non-negative numbers (inf allowed)" if allow_inf else "finite, non-negative"
            raise PlanError(f"{name}[{i}] is {v!r}; it must be {kind}")


def _validate(p: PartitionProblem) -> None:
    n = len(p.time_s)
    if n == 0:
        raise PlanError("the partition problem has no blocks; give at least one block")
    for name in ("recompute_s", "static_bytes", "activation_bytes"):
        got = len(getattr(p, name))
        if got != n:
            raise PlanError(f"{name} has {got} entries but time_s has {n}; give one per block")
    if not isinstance(p.stages, int) or not 1 <= p.stages <= n:
        raise PlanError(f"stages must be an integer from 1 to the number of blocks ({n}), got {p.stages!r}")
    for name in ("inflight", "stage_memory_limit"):
        got = len(getattr(p, name))
        if got != p.stages:
            raise PlanError(f"{name} has {got} entries but there are {p.stages} stages; give one per stage")
    memo = p.memo if p.memo is not None and p.memo.owns(p) else None
    if memo is None or not memo.checked:
        _check_blocks(p)
        if memo is not None:
            memo.checked = True
    _check_numbers("inflight", p.inflight)
    _check_numbers("stage_memory_limit", p.stage_memory_limit, allow_inf=True)
    _check_numbers("link_latency_s", (p.link_latency_s,))
    if math.isnan(p.link_bandwidth) or not p.link_bandwidth > 0:
        raise PlanError(f"link_bandwidth must be > 0 bytes/s (inf allowed), got {p.link_bandwidth!r}")
    if p.recompute not in RECOMPUTE_MODES:
        raise PlanError(f"recompute must be 'never', 'always' or 'auto', got {p.recompute!r}")
    if isinstance(p.recompute_layers, bool) or not isinstance(p.recompute_layers, int) or p.recompute_layers < 0:
        raise PlanError(f"recompute_layers must be a whole number >= 0, got {p.recompute_layers!r}")
    if p.recompute_layers and (len(p.layers) != n or p.recompute != "never"):
        raise PlanError(
            f"recompute_layers {p.recompute_layers} needs one layers flag per block ({len(p.layers)} for {n}) "
            f"and recompute 'never' (got {p.recompute!r}): the block method is the stages' one recomputation"
        )


def _check_blocks(p: PartitionProblem) -> None:
    n = len(p.time_s)
    _check_numbers("time_s", p.time_s)
    _check_numbers("recompute_s", p.recompute_s)
    _check_numbers("static_bytes", p.static_bytes)
    _check_numbers("activation_bytes", p.activation_bytes)
    for k, t in enumerate(p.tensors):
        if not -1 <= t.src < n:
            raise PlanError(f"tensor {k} has src {t.src}; it must be -1 (a model input) or a block index below {n}")
        for d in t.dsts:
            if not t.src < d < n:
                raise PlanError(
                    f"tensor {k} (src {t.src}) has consumer {d}; consumers must "
                    f"come after the producer and be below {n} (topological order)"
                )
        _check_numbers(f"tensor {k} bytes", (t.bytes,))


@dataclass(frozen=True)
class Partition:
    """A partition of the blocks into stages and what it costs (see the module docstring)."""

    stage_of_block: tuple[int, ...]
    recompute: tuple[bool, ...]  # per stage
    bottleneck_s: float  # Z
    total_s: float
    stage_time_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]
    cut_bytes: tuple[float, ...]  # per cut c between stage c and c+1
    comm_s: tuple[float, ...]  # per cut
    fits: bool  # every stage within its memory limit

    @property
    def boundaries(self) -> tuple[int, ...]:
        """First (lowest-index) block of each stage; for a contiguous partition, its cuts."""
        first: dict[int, int] = {}
        for i, s in enumerate(self.stage_of_block):
            first.setdefault(s, i)
        return tuple(first[s] for s in range(len(self.recompute)))

    @property
    def recomputed_stages(self) -> int:
        return sum(self.recompute)


@dataclass(frozen=True)
class StageStats:
    """Per-stage sums of an assignment, before the recompute choice (internal to the solvers)."""

    time: tuple[float, ...]
    extra: tuple[float, ...]  # recompute time
    static: tuple[float, ...]
    act: tuple[float, ...]
    in_bytes: tuple[float, ...]
    cut_bytes: tuple[float, ...]
    comm: tuple[float, ...]
    # the block method (partition/layers.py), zero without it: per stage the recomputed layers'
    # forward and the largest of their activations (``act`` already keeps only their inputs)
    layer_extra: tuple[float, ...] = ()
    layer_peak: tuple[float, ...] = ()

    def memory(self, p: PartitionProblem, s: int, recompute: bool) -> float:
        if recompute:
            return self.static[s] + p.inflight[s] * self.in_bytes[s] + self.act[s]
        peak = self.layer_peak[s] if self.layer_peak else 0.0
        return self.static[s] + p.inflight[s] * self.act[s] + peak

    def time_of(self, s: int, recompute: bool) -> float:
        """Stage s's time: its blocks', plus the forward it recomputes (whole, or its first layers)."""
        if recompute:
            return self.time[s] + self.extra[s]
        return self.time[s] + self.layer_extra[s] if self.layer_extra else self.time[s]


def comm_time(p: PartitionProblem, cut_bytes: float) -> float:
    """comm_s of a cut carrying ``cut_bytes``."""
    return p.link_latency_s + cut_bytes / p.link_bandwidth if cut_bytes > 0 else 0.0


def stage_stats(p: PartitionProblem, stage_of_block: Sequence[int]) -> StageStats:
    """Check an assignment (length, range, monotone, no empty stage) and sum it per stage
    (the last few kept in ``p.memo``: the search sums one split up to four times — its bound,
    its recomputation rule, its costs; by the problem's identity and the assignment's value)."""
    key = tuple(stage_of_block)
    memo = p.memo if p.memo is not None and p.memo.owns(p) else None
    if memo is None:
        return _stage_stats(p, key)
    hit: StageStats | None = memo.stats.get((p,), key)
    return memo.stats.put((p,), key, _stage_stats(p, key)) if hit is None else hit


_VECTOR_FROM = 64  # blocks from which _stage_stats sums with numpy (below, the loop is faster)


def _stage_stats(p: PartitionProblem, stage_of_block: tuple[int, ...]) -> StageStats:
    n = p.blocks
    if len(stage_of_block) != n:
        raise PlanError(
            f"the assignment has {len(stage_of_block)} entries but there are {n} blocks; give one stage per block"
        )
    if p.recompute_layers:
        return _with_layers(p, stage_of_block, _plain_stats(p, stage_of_block))
    return _plain_stats(p, stage_of_block)


def _with_layers(p: PartitionProblem, stage_of_block: tuple[int, ...], st: StageStats) -> StageStats:
    """``st`` with the block method's terms (partition/layers.py)."""
    extra, saving, peak = stage_terms(p, stage_of_block, p.stages)
    act = tuple(a - x for a, x in zip(st.act, saving, strict=True))
    return replace(st, act=act, layer_extra=tuple(extra), layer_peak=tuple(peak))


def _plain_stats(p: PartitionProblem, stage_of_block: tuple[int, ...]) -> StageStats:
    n = p.blocks
    if n < _VECTOR_FROM:
        return _stage_stats_py(p, stage_of_block)
    blocks = (p.time_s, p.recompute_s, p.static_bytes, p.activation_bytes)
    memo = p.memo if p.memo is not None and p.memo.owns(p) else None
    flat: Flat
    if memo is None:
        flat = flat_of(blocks, p.tensors)
    elif memo.flat is None:
        flat = memo.flat = flat_of(blocks, p.tensors)
    else:
        flat = memo.flat
    (time, extra, static, act), in_bytes, cut = stage_sums(blocks, p.tensors, p.stages, stage_of_block, flat)
    return StageStats(time, extra, static, act, in_bytes, cut, tuple(comm_time(p, b) for b in cut))


def _stage_stats_py(p: PartitionProblem, stage_of_block: tuple[int, ...]) -> StageStats:
    S = p.stages
    time, extra, static, act = [0.0] * S, [0.0] * S, [0.0] * S, [0.0] * S
    for i, s in enumerate(stage_of_block):
        if not 0 <= s < S:
            raise PlanError(f"block {i} is assigned to stage {s}; stages are 0..{S - 1}")
        time[s] += p.time_s[i]
        extra[s] += p.recompute_s[i]
        static[s] += p.static_bytes[i]
        act[s] += p.activation_bytes[i]
    used = set(stage_of_block)
    if len(used) != S:
        empty = min(set(range(S)) - used)
        raise PlanError(f"stage {empty} has no blocks; every one of the {S} stages needs one")
    in_bytes, cut = [0.0] * S, [0.0] * max(S - 1, 0)
    for k, t in enumerate(p.tensors):
        if not t.dsts:
            continue
        consumers = {stage_of_block[d] for d in t.dsts}
        lo = stage_of_block[t.src] if t.src >= 0 else -1
        if lo > min(consumers):
            raise PlanError(
                f"tensor {k} goes from block {t.src} (stage {lo}) back to stage "
                f"{min(consumers)}; stages must not decrease along tensors"
            )
        for s in consumers:
            if s > lo:
                in_bytes[s] += t.bytes
        if lo >= 0:
            for c in range(lo, max(consumers)):
                cut[c] += t.bytes
    comm = tuple(comm_time(p, b) for b in cut)
    return StageStats(tuple(time), tuple(extra), tuple(static), tuple(act), tuple(in_bytes), tuple(cut), comm)


def auto_recompute(p: PartitionProblem, st: StageStats) -> tuple[bool, ...]:
    """The per-stage recompute choice of ``p.recompute`` (the dominance rule for "auto")."""
    if p.recompute == "never":
        return (False,) * p.stages
    if p.recompute == "always":
        return (True,) * p.stages
    return tuple(
        not memory_fits(st.memory(p, s, False), p.stage_memory_limit[s])
        and memory_fits(st.memory(p, s, True), p.stage_memory_limit[s])
        for s in range(p.stages)
    )


def evaluate(
    problem: PartitionProblem,
    stage_of_block: Sequence[int],
    recompute: Sequence[bool] | None = None,
) -> Partition:
    """Price an assignment; the single source of truth for the definitions above.

    ``recompute`` is per stage; ``None`` applies the problem's mode (the dominance rule in
    "auto"). Raises :class:`PlanError` for an invalid assignment or a recompute choice the
    mode forbids; an assignment that exceeds memory is priced with ``fits=False``.
    """
    p = problem
    st = stage_stats(p, stage_of_block)
    if recompute is None:
        rc = auto_recompute(p, st)
    else:
        rc = tuple(bool(r) for r in recompute)
        if len(rc) != p.stages:
            raise PlanError(f"recompute has {len(rc)} entries but there are {p.stages} stages")
        if (p.recompute == "never" and any(rc)) or (p.recompute == "always" and not all(rc)):
            raise PlanError(f"recompute {rc} contradicts the problem's mode {p.recompute!r}")
    times = tuple(st.time_of(s, rc[s]) for s in range(p.stages))
    memory = tuple(st.memory(p, s, rc[s]) for s in range(p.stages))
    return Partition(
        stage_of_block=tuple(int(s) for s in stage_of_block),
        recompute=rc,
        bottleneck_s=max(max(times), max(st.comm, default=0.0)),
        total_s=sum(times) + sum(st.comm),
        stage_time_s=times,
        stage_memory_bytes=memory,
        cut_bytes=st.cut_bytes,
        comm_s=st.comm,
        fits=all(memory_fits(m, lim) for m, lim in zip(memory, p.stage_memory_limit, strict=True)),
    )


def contiguous_assignment(boundaries: Sequence[int], n: int) -> tuple[int, ...]:
    """Stage of each block for contiguous stages starting at ``boundaries`` (first is 0)."""
    ends = [*boundaries[1:], n]
    return tuple(s for s, (a, b) in enumerate(zip(boundaries, ends, strict=True)) for _ in range(a, b))
