"""Pricing one contiguous split: the one function the search and ``--balance`` share.

A *split* is the number of blocks on each chunk, in chunk order (``balance``: S entries for a
one-chunk schedule, S·v for interleaved and V schedules). :func:`price_split` turns it into
the assignment of every block, prices it with :func:`~autopipe.partition.problem.evaluate` and
simulates the schedule's own action lists (:func:`~autopipe.planner.pricing.price`). The
recomputation is the request's mode; in "auto", none at all when the simulated peak of every
device fits without it (recomputing is never faster), else the per-chunk dominance rule of
``evaluate`` (each chunk against the device's limit / v). A split is simulated without
recomputation only when it may fit so (:func:`plain_may_fit`, a least peak per device from the
schedule's in-flight counts). The
search (:mod:`autopipe.planner.search`, :mod:`autopipe.planner.exact`) prices every split it
simulates with this same function, so "the best split" means one thing everywhere.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

from autopipe.costs.profile import Profile
from autopipe.errors import PlanError
from autopipe.partition.memo import BlockMemo
from autopipe.partition.problem import (
    SCREEN_SLACK,
    Edge,
    PartitionProblem,
    contiguous_assignment,
    evaluate,
    memory_fits,
)
from autopipe.planner.pricing import (
    BlockTimes,
    Decision,
    Priced,
    candidate,
    fits,
    micro_batch_size,
    price,
)
from autopipe.planner.request import PlanRequest
from autopipe.schedules import schedule_spec

__all__ = [
    "BlockNumbers",
    "check_balance",
    "chunk_limit",
    "device_limit",
    "plain_may_fit",
    "price_split",
    "problem_of",
    "split_assignment",
]


def chunk_limit(memory_limit: float, virtual: int) -> float:
    """The memory limit of one chunk of a device running ``virtual`` chunks: its share (the
    partition problems' ``stage_memory_limit``, a heuristic for their own cuts: the simulated
    per-device peak decides what fits)."""
    return memory_limit / virtual


def device_limit(chunk: float, virtual: int) -> float:
    """The device limit whose :func:`chunk_limit` is ``chunk`` (the way back, for the error's
    smallest limit that fits)."""
    return chunk * virtual


@dataclass(frozen=True)
class BlockNumbers:
    """One micro-batch size's per-block numbers as the partition problems take them (every
    decision at that size shares them), with the memo the partition kernels keep of them."""

    time_s: tuple[float, ...]  # forward + backward
    recompute_s: tuple[float, ...]  # forward
    static_bytes: tuple[float, ...]  # parameters x the request's state factor
    activation_bytes: tuple[float, ...]
    tensors: tuple[Edge, ...]  # those with consumers
    memo: BlockMemo = field(default_factory=BlockMemo, compare=False, repr=False)

    @staticmethod
    def of(profile: Profile, u: int, state_factor: float) -> BlockNumbers:
        blocks = profile.blocks
        return BlockNumbers(
            tuple(b.forward_s(u) + b.backward_s(u) for b in blocks),
            tuple(b.forward_s(u) for b in blocks),
            # parameters with their gradients and optimizer state, and an offload's staging buffer
            tuple((b.param_bytes + b.shared_param_bytes) * state_factor + b.staging_bytes(u) for b in blocks),
            tuple(b.saved_bytes(u) for b in blocks),
            tuple(Edge(t.src, t.dsts, t.bytes(u)) for t in profile.tensors if t.dsts),
        )


def problem_of(
    profile: Profile, req: PlanRequest, decision: Decision, numbers: BlockNumbers | None = None
) -> PartitionProblem:
    """The partition problem of ``decision``: S·v chunks, each with its :func:`chunk_limit`
    (what the chain solvers and the "auto" recomputation rule see; the simulator's per-device
    peak decides what fits). ``numbers``: :meth:`BlockNumbers.of` at its micro-batch size."""
    u = micro_batch_size(req.batch_size, decision)
    chunks = req.devices * decision.virtual
    b = BlockNumbers.of(profile, u, req.state_factor) if numbers is None else numbers
    return PartitionProblem(
        time_s=b.time_s,
        recompute_s=b.recompute_s,
        static_bytes=b.static_bytes,
        activation_bytes=b.activation_bytes,
        tensors=b.tensors,
        stages=chunks,
        inflight=schedule_spec(decision.schedule).inflight(req.devices, decision.micro_batches, decision.virtual),
        stage_memory_limit=(chunk_limit(req.memory_limit, decision.virtual),) * chunks,  # a device's v stages share it
        link_latency_s=req.link_latency_s,
        link_bandwidth=req.link_bandwidth,
        recompute="never" if decision.memory.layers else req.recompute,
        memo=b.memo,
        layers=tuple(x.layer for x in profile.blocks) if decision.memory.layers else (),
        recompute_layers=decision.memory.layers,
    )


def split_assignment(sizes: Sequence[int]) -> tuple[int, ...]:
    """The chunk of every block when chunk j takes the next ``sizes[j]`` blocks."""
    starts = [0]
    for s in sizes[:-1]:
        starts.append(starts[-1] + s)
    return contiguous_assignment(starts, sum(sizes))


def price_split(
    profile: Profile,
    req: PlanRequest,
    decision: Decision,
    sizes: Sequence[int],
    *,
    problem: PartitionProblem | None = None,
    times: BlockTimes | None = None,
    source: str = "split",
) -> Priced:
    """Price the split ``sizes`` (blocks per chunk, chunk order) under ``decision``:
    evaluate (recomputation by the request's mode) and simulate. ``problem`` and ``times``,
    when given, are :func:`problem_of` and ``BlockTimes.of`` of the same decision (the search's
    context at its micro-batch size: ``planner.context``)."""
    p = problem_of(profile, req, decision) if problem is None else problem
    t = (
        BlockTimes.of(
            profile,
            micro_batch_size(req.batch_size, decision),
            req.action_overhead_s,
            None,
            req.blocking_sends,
            req.send_overhead_s,
        )
        if times is None
        else times
    )
    assignment = split_assignment(sizes)
    plain: Priced | None = None
    if p.recompute == "auto" and plain_may_fit(p, decision, req.devices, req.memory_limit, sizes):
        c = candidate(decision, source, p, evaluate(p, assignment, (False,) * p.stages), t)
        plain = Priced(c, price(c, req.devices))  # nothing recomputed when every device fits without it
        if fits(plain[1], req.memory_limit):
            return plain
    part = evaluate(p, assignment)
    if plain is not None and not any(part.recompute):
        return plain
    c = candidate(decision, source, p, part, t)
    return Priced(c, price(c, req.devices))


def plain_may_fit(
    problem: PartitionProblem, decision: Decision, devices: int, memory_limit: float, sizes: Sequence[int]
) -> bool:
    """Whether the split ``sizes`` may fit with nothing recomputed (a screen before simulating
    it so; the simulator has the last word): False when some device's static bytes plus its
    chunks' in-flight micro-batches (``problem.inflight`` summed, less one with v > 1) times its
    smallest chunk's activations exceed ``memory_limit``. That many micro-batches are held at
    once on every schedule (tests/planner/test_splits.py checks it against the simulator)."""
    placed = schedule_spec(decision.schedule).devices_of(devices, decision.virtual)
    static, held, least = [0.0] * devices, [0.0] * devices, [math.inf] * devices
    i = 0
    for j, size in enumerate(sizes):
        r = placed[j]
        static[r] += sum(problem.static_bytes[i : i + size])
        held[r] += problem.inflight[j]
        least[r] = min(least[r], sum(problem.activation_bytes[i : i + size]))
        i += size
    less = 1.0 if decision.virtual > 1 else 0.0
    peaks = (a + max(h - less, 1.0) * b for a, h, b in zip(static, held, least, strict=True))
    return memory_fits(max(peaks), memory_limit, SCREEN_SLACK)


def check_balance(
    balance: Sequence[int],
    blocks: int,
    devices: int,
    schedule: str | None,
    virtual: int | None,
    flag: str = "--balance",
) -> int:
    """Check a user's ``balance`` (blocks per chunk) and return its chunks per device v.

    One line (PlanError, naming ``flag``) for: a wrong length, an entry below 1, a sum other
    than the model's blocks, S·v entries without a schedule that runs v chunks per device.
    """
    if isinstance(balance, (str, bytes)) or not isinstance(balance, Sequence):
        raise PlanError(
            f"{flag} must be a sequence of blocks per chunk, "
            f"like {_example(blocks, devices).replace(',', ', ')} (got {balance!r})"
        )
    sizes = list(balance)
    schedule_flag, virtual_flag = ("--schedule", "--virtual") if flag.startswith("--") else ("schedule=", "virtual=")
    if not sizes:
        raise PlanError(f"{flag} is empty; give blocks per chunk, like {_example(blocks, devices)}")
    if any(not isinstance(x, numbers.Integral) or isinstance(x, bool) or x < 1 for x in sizes):
        bad = next(x for x in sizes if not isinstance(x, numbers.Integral) or isinstance(x, bool) or x < 1)
        raise PlanError(
            f"{flag} entries must be positive block counts (got {bad!r}); every chunk needs at least one block"
        )
    sizes = [int(x) for x in sizes]
    if sum(sizes) != blocks:
        raise PlanError(
            f"{flag} sums to {sum(sizes)} blocks but the model has {blocks}; give blocks per chunk that sum to {blocks}"
        )
    if len(sizes) % devices:
        raise PlanError(
            f"{flag} has {len(sizes)} entries for {devices} devices; give {devices} (one chunk per device) "
            f"or {devices} x v for a schedule of v chunks per device"
        )
    v = len(sizes) // devices
    if virtual is not None and virtual != v:
        raise PlanError(
            f"{flag} has {len(sizes)} entries = {devices} devices x {v} chunks, "
            f"but {virtual_flag} is {virtual}; drop one"
        )
    if schedule is None:
        if v != 1:
            raise PlanError(
                f"{flag} has {len(sizes)} entries = {devices} devices x {v} chunks; "
                f"name the schedule that runs {v} chunks "
                f"per device with {schedule_flag} (e.g. interleaved-1f1b, zb-v)"
            )
        return 1
    spec = schedule_spec(schedule)
    if v not in spec.virtual_choices:
        want = " or ".join(str(devices * c) for c in spec.virtual_choices)
        raise PlanError(
            f"{flag} has {len(sizes)} entries but {schedule} on {devices} devices runs {want} chunks; "
            f"give {want} entries"
        )
    return v


def _example(blocks: int, devices: int) -> str:
    base, extra = divmod(blocks, devices)
    return ",".join(str(base + (1 if d < extra else 0)) for d in range(devices))
