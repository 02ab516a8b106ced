"""Lower bounds on the simulated iteration time: what the search's branch and bound prunes by.

- :func:`decision_bound`: a time no plan of a decision (schedule, v, m) can beat, whatever its
  cuts — the decisions are opened in its order and skipped once it reaches the best plan.
- :func:`candidate_bound`: a time the simulator cannot beat for one candidate (its cuts known).
- :func:`split_bound`: the same for a split known by its sizes alone (before summing it up).
- :func:`reach_bound`: a time no split within a few one-block moves of a candidate's can beat
  (what the local moves from it may reach).
- :func:`lower_bound`: the least decision bound of a request (``bench/bench_planner.py``
  reports a plan's gap to it).

Every bound is tested below the simulator on seeded random cases (tests/planner/test_bounds.py,
tests/planner/test_exact.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from autopipe.costs.profile import Profile
from autopipe.partition.problem import EPS, SCREEN_SLACK, PartitionProblem, memory_cap
from autopipe.planner.pricing import BlockTimes, Candidate, Decision, Schedules, micro_batch_size
from autopipe.planner.request import PlanRequest, decisions
from autopipe.schedules import schedule_spec

__all__ = [
    "PRUNE_TOLERANCE",
    "Work",
    "candidate_bound",
    "decision_bound",
    "layer_work",
    "lower_bound",
    "reach_bound",
    "split_bound",
    "work_table",
]

PRUNE_TOLERANCE = 1e-12
"""A bound must beat the best so far by more than this (relative) to be searched: bounds and
simulated times are sums of the same floats in other orders, so exact ties differ by rounding."""


def lower_bound(profile: Profile, request: PlanRequest) -> float:
    """A time no plan of ``request`` can beat (the least decision bound): the gap of a plan
    found by local moves, on decisions too large to enumerate, is measured against it."""
    work, layers = work_table(profile, request.devices), layer_work(profile)
    return min((decision_bound(work, request, d, layers) for d in decisions(profile, request)), default=math.inf)


def candidate_bound(profile: Profile, req: PlanRequest, c: Candidate) -> float:
    """A time the simulator cannot beat for this candidate (its cuts are known now).

    For each chunk j of rank r: r's work on its chunks from j on (all m F and m B) cannot
    start before micro-batch 0's forward reaches chunk j, and after the last of those B the
    gradient still crosses every chunk before j (on a V, the up chunk waits for the way down). Every rank also
    works m times its stages' F + B + W, and micro-batch 0 makes the whole round trip.
    """
    split = schedule_spec(c.decision.schedule).splits_backward
    f = [x.forward_s for x in c.costs]
    b = [x.backward_input_s if split else x.backward_s for x in c.costs]
    w = [x.backward_weight_s if split else 0.0 for x in c.costs]
    comm = c.partition.comm_s
    if c.decision.schedule in c.times.blocking_sends:  # the sends are in the senders' times (pricing.with_sends)
        comm = (0.0,) * len(comm)
    return _chunk_bound(req, c.decision, f, b, w, comm, c.times.schedules)


def reach_bound(req: PlanRequest, d: Decision, sizes: Sequence[int], times: BlockTimes, shifts: int) -> float:
    """A time the simulator cannot beat for any split within ``shifts`` one-block moves of
    ``sizes`` (blocks per chunk; :func:`~autopipe.planner.moves.local_moves` makes such moves),
    recomputed or not: each move takes at most one block off each chunk, at its ends, so chunk
    j keeps at least a window of ``sizes[j] - shifts`` of its blocks — its F, B and W are at
    least the least such window's — and the links may cost nothing. :func:`candidate_bound`
    on those costs (it only grows with every cost)."""
    size = np.asarray(sizes, dtype=np.int64)
    start = np.cumsum(size) - size
    keep = size - shifts  # blocks chunk j surely keeps, in a window
    offsets = np.arange(min(shifts, int(size.max())) + 1)
    kept = np.maximum(keep, 0)
    lo = np.minimum(start[:, None] + offsets[None, :], (start + size - kept)[:, None])  # each window's first block
    hi = lo + kept[:, None]
    f, b, bi, w = ((p[hi] - p[lo]).min(axis=1) for p in times.prefix)  # the least window of each
    return _bound_of(req, d, f, b, bi, w, np.zeros(len(sizes)), times, (0.0,) * (len(sizes) - 1))


def split_bound(
    req: PlanRequest, d: Decision, problem: PartitionProblem, times: BlockTimes, sizes: Sequence[int]
) -> float:
    """A time the simulator cannot beat for the split ``sizes`` as ``price_split`` prices it,
    from prefix sums alone (no stage statistics; the search queues a simple split by it and
    sums the split up only when the queue reaches it): the links may cost nothing, and a chunk
    is recomputed only where it must be — with recomputation always, or in "auto" where
    nothing-recomputed cannot fit (:func:`~autopipe.planner.splits.plain_may_fit`'s test) and the
    chunk's own activations exceed its limit (evaluate's rule; a split that rule does not fit
    is not queued)."""
    size = np.asarray(sizes, dtype=np.int64)
    end = np.cumsum(size)
    start = end - size
    f, b, bi, w = (p[end] - p[start] for p in times.prefix)
    recompute = np.zeros(len(sizes), dtype=bool)
    if problem.recompute == "always":
        recompute[:] = True
    elif problem.recompute == "auto":
        static, act = (p[end] - p[start] for p in _memory_prefix(problem))
        inflight = np.asarray(problem.inflight)
        # plain_may_fit's least peak per device, vectorised; "surely over" with a margin for the sums' order
        placed = _placement(d.schedule, req.devices, d.virtual, times.schedules)[0]
        least = np.full(req.devices, np.inf)
        np.minimum.at(least, placed, act)
        held = np.bincount(placed, weights=inflight, minlength=req.devices) - (1.0 if d.virtual > 1 else 0.0)
        peaks = np.bincount(placed, weights=static, minlength=req.devices) + np.maximum(held, 1.0) * least
        if peaks.max() > memory_cap(
            memory_cap(req.memory_limit, SCREEN_SLACK), 2 * EPS
        ):  # nothing-recomputed cannot fit
            plain = static + inflight * act
            recompute = plain > memory_cap(
                np.asarray(problem.stage_memory_limit, dtype=np.float64), 2 * EPS
            )  # surely over, sums in any order
    return _bound_of(req, d, f, b, bi, w, np.where(recompute, f, 0.0), times, (0.0,) * (len(sizes) - 1))


def _bound_of(
    req: PlanRequest,
    d: Decision,
    f: npt.NDArray[np.float64],
    b: npt.NDArray[np.float64],
    bi: npt.NDArray[np.float64],
    w: npt.NDArray[np.float64],
    extra: npt.NDArray[np.float64],
    times: BlockTimes,
    comm_s: Sequence[float],
) -> float:
    """:func:`candidate_bound` on per-chunk block sums, as ``pricing.costs_of`` makes a stage's
    costs of them (``extra``: the recomputed forward; the first chunk's split backward is all W)."""
    first, o = np.arange(len(f)) == 0, times.action_s
    fs = f + o
    if schedule_spec(d.schedule).splits_backward:
        bs, ws = np.where(first, 0.0, bi + extra) + o, np.where(first, b + extra, w) + o
    else:
        bs, ws = b + extra + o, np.zeros(len(f))
    return _chunk_bound(req, d, fs.tolist(), bs.tolist(), ws.tolist(), comm_s, times.schedules)


def _memory_prefix(problem: PartitionProblem) -> tuple[npt.NDArray[np.float64], ...]:
    """Prefix sums of ``problem``'s static and activation bytes per block (kept in its memo:
    every decision at one micro-batch size shares them)."""
    memo = problem.memo if problem.memo is not None and problem.memo.owns(problem) else None
    if memo is not None and memo.memory_prefix is not None:
        kept: tuple[npt.NDArray[np.float64], ...] = memo.memory_prefix
        return kept
    sums = tuple(np.concatenate(([0.0], np.cumsum(x))) for x in (problem.static_bytes, problem.activation_bytes))
    if memo is not None:
        memo.memory_prefix = sums
    return sums


def _chunk_bound(
    req: PlanRequest,
    d: Decision,
    f: Sequence[float],
    b: Sequence[float],
    w: Sequence[float],
    comm_s: Sequence[float],
    schedules: Schedules,
) -> float:
    """:func:`candidate_bound` on per-chunk F, B (input-gradient B where W is split off), W and links."""
    placed, order, first = _placement(d.schedule, req.devices, d.virtual, schedules)
    fa, ba, wa = np.asarray(f, dtype=float), np.asarray(b, dtype=float), np.asarray(w, dtype=float)
    comm = np.zeros(len(fa))  # comm[j]: the link after chunk j, only between devices
    if len(fa) > 1:
        comm[:-1] = np.where(placed[:-1] != placed[1:], np.asarray(comm_s, dtype=float), 0.0)
    m = d.micro_batches
    busy, work = (
        _own_suffix(fa + ba + wa, order, first),
        _own_suffix(fa + ba, order, first),
    )  # rank placed[j]'s chunks from j on
    ahead = np.cumsum(fa + comm) - (fa + comm)  # F (and links) of the chunks before chunk j
    before = np.cumsum(fa + ba + 2 * comm) - (fa + ba + 2 * comm)  # F + B (and links) alike
    chain = float(fa.sum() + ba.sum() + 2 * comm.sum())
    return max(chain, float((ahead + m * busy).max()), float((before + m * work).max()))


def _own_suffix(
    x: npt.NDArray[np.float64], order: npt.NDArray[np.int64], first: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Per chunk j: the sum of ``x`` over its device's chunks from j on (``order``: chunks by
    device, last first; ``first``: where each device's run starts in it)."""
    run = np.cumsum(x[order])
    out = np.empty(len(x))
    out[order] = run - np.repeat(np.concatenate(([0.0], run))[first], np.diff(np.append(first, len(x))))
    return out


def _placement(schedule: str, devices: int, virtual: int, schedules: Schedules) -> tuple[npt.NDArray[np.int64], ...]:
    """The device of each chunk, the chunks by device (last first) and where each device's run
    starts (kept in ``schedules``)."""
    hit = schedules.placement.get((schedule, devices, virtual))
    if hit is None:
        hit = schedules.placement[schedule, devices, virtual] = _placement_of(schedule, devices, virtual)
    return hit


def _placement_of(schedule: str, devices: int, virtual: int) -> tuple[npt.NDArray[np.int64], ...]:
    placed = np.asarray(schedule_spec(schedule).devices_of(devices, virtual), dtype=np.int64)
    order = np.lexsort((-np.arange(len(placed)), placed))
    runs = placed[order]
    first = np.flatnonzero(np.concatenate(([True], runs[1:] != runs[:-1])))
    return placed, order, first


def decision_bound(work: Work, req: PlanRequest, d: Decision, layers: LayerWork | None = None) -> float:
    """A time no plan of decision ``d`` can beat, whatever its cuts (so the search may skip it).

    Micro-batch 0 runs forward through every stage and back, one action after another, so
    the iteration takes at least the model's whole F + B for one micro-batch (B: the input-
    gradient part when W is split off, which the first stage does not have); and the ranks share m times
    the model's total work T, so the busiest works at least a 1/S share of it. Sharper, for one stage per rank: rank r
    cannot start before micro-batch 0's forward has crossed stages 0..r-1, then works m t_r,
    and (GPipe, 1F1B) its last gradient still crosses stages r-1..0 — at least
    ``a P_r + m t_r`` with ``P_r`` the work of the stages before r and ``a`` the smallest
    share of a block's work on that path (1 with the backward, f / (f + b) without). The
    cuts that make these equal for every r give the bound ``a T / (1 - (1 - a / m)^S)``
    (blocks cannot be cut finer, and communication and recomputation only add).

    With the block method (``d.memory.layers`` k, ``layers``: :func:`layer_work`), the work gains
    the layers every split recomputes at least: of the S·v chunks, all but the N blocks that are
    no layer hold a layer, and each recomputes min(k, its layers): at least (S v - N - 1) + min(k,
    L - (S v - N - 1)) of the L layers, each at least the cheapest layer's forward.
    """
    u = micro_batch_size(req.batch_size, d)
    total, chain, share = work(u, schedule_spec(d.schedule).splits_backward)
    if layers is not None and d.memory.layers:
        cheapest, count, others = layers(u)
        holding = req.devices * d.virtual - others  # chunks that hold a layer, at least
        if holding > 0 and count >= holding:
            total += cheapest * ((holding - 1) + min(d.memory.layers, count - (holding - 1)))
    bound = max(chain, d.micro_batches * total / req.devices)
    if d.virtual == 1 and share > 0:
        m, S = d.micro_batches, req.devices
        x = share / m  # 1 - (1 - x)^S below, exact also where x is below float precision (huge batches)
        bound = max(bound, share * total / (1.0 if x >= 1 else -math.expm1(S * math.log1p(-x))))
    return bound


Work = Callable[[int, bool], tuple[float, float, float]]
LayerWork = Callable[[int], tuple[float, int, int]]


def layer_work(profile: Profile) -> LayerWork:
    """``layers(u)``: (the cheapest layer's forward, the layers, the blocks that are no layer) at
    micro-batch size ``u``: what the block method's bound reads (:func:`decision_bound`)."""
    flagged = [b for b in profile.blocks if b.layer]

    @functools.cache
    def layers(u: int) -> tuple[float, int, int]:
        cheapest = min((b.forward_s(u) for b in flagged), default=0.0)
        return cheapest, len(flagged), len(profile.blocks) - len(flagged)

    return layers


def work_table(profile: Profile, devices: int) -> Work:
    """``work(u, split)``: (T: every block's F + B, the chain micro-batch 0 must cross, the
    share ``a`` of :func:`decision_bound`) at micro-batch size ``u``, computed once each."""

    @functools.cache
    def work(u: int, split: bool) -> tuple[float, float, float]:
        blocks = profile.blocks
        f = [b.forward_s(u) for b in blocks]
        t = [fi + b.backward_s(u) for fi, b in zip(f, blocks, strict=True)]
        total = sum(t)
        if not split:
            return total, total, 1.0
        # B of the first stage is empty (its inputs need no gradient); the last S - 1 blocks
        # are never on it.
        tail = blocks[len(blocks) - devices + 1 :] if devices > 1 else ()
        chain = sum(f) + sum(b.backward_input_s(u) for b in tail)
        share = min((fi / ti for fi, ti in zip(f, t, strict=True) if ti > 0), default=0.0)
        return total, chain, share

    return work
