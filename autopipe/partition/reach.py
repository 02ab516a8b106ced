"""A quick proof that no contiguous partition fits memory: :func:`cannot_fit`.

The planner opens thousands of decisions whose chunks cannot hold the model at all (GPipe's
m micro-batches in flight, or a memory choice's search on a shallow pipeline); the solvers
prove each one infeasible with a whole dynamic program or bisection. A greedy walk proves most
of them in one pass over the blocks instead:

    reach_0 = 0;  reach_j = the furthest end e such that the range [reach_{j-1}, e) fits chunk j

where "fits" reads a lower bound on the chunk's memory under :mod:`autopipe.partition.problem`'s
rule that only grows when a range grows at either end: the static bytes plus the in-flight count
times the activations (``never``); with recomputation allowed ("auto", "always") the least of
that and one micro-batch's activations, min(k, 1) times them; with the block method (first k
layers recomputed, ``partition/layers.py``) the activations less the k largest any layer has
(a recomputed layer keeps at least its input, and its peak is not counted). Any contiguous
partition's chunk j ends at or before reach_j (by induction: its start is at or before
reach_{j-1}, and a range that fits still fits with blocks taken off its start), so reach_K < n
means no partition fits, and the solvers would raise InfeasibleError. A chunk "fits" here up
to :data:`~autopipe.partition.problem.SCREEN_SLACK` over its limit (wider than the rule's
:data:`~autopipe.partition.problem.EPS`), so sums taken in another order never turn a
feasible problem into a proof. False says nothing: the solver decides.

Tests: tests/partition/test_reach.py (against the chain DP and brute force on seeded random
problems: every proof is right, and without recomputation or the block method it misses only
what the tolerances leave).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from autopipe.partition.problem import SCREEN_SLACK, PartitionProblem, memory_cap

__all__ = ["cannot_fit"]


def cannot_fit(
    problem: PartitionProblem, inflight: Sequence[float] | None = None, limits: Sequence[float] | None = None
) -> bool:
    """True when no contiguous partition of ``problem`` fits its stages' memory limits in any
    recomputation its mode allows (see the module docstring); False when one may. ``inflight``
    and ``limits``, given, take the place of the problem's (``planner/exact.py``'s floor: one
    micro-batch of each chunk, the device's limit)."""
    p = problem
    n = p.blocks
    inflight = p.inflight if inflight is None else inflight
    limits = p.stage_memory_limit if limits is None else limits
    static, act = p.static_bytes, p.activation_bytes
    spare = 0.0  # what the block method's recomputed layers may keep less, at most
    if p.recompute_layers:
        spare = sum(heapq.nlargest(p.recompute_layers, (a for a, layer in zip(act, p.layers, strict=True) if layer)))
    pos = 0
    for j in range(p.stages):
        held = inflight[j] if p.recompute == "never" else min(inflight[j], 1.0)
        cap = memory_cap(limits[j], SCREEN_SLACK)
        st = ac = 0.0
        while pos < n:
            st2, ac2 = st + static[pos], ac + act[pos]
            if st2 + held * max(0.0, ac2 - spare) > cap:
                break
            st, ac, pos = st2, ac2, pos + 1
        if pos == n:
            return False
    return True
