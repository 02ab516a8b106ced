"""The banded chain DP equals the full-table DP it replaced, bit for bit: same cuts, same
recomputation, same bottleneck and total (the full (n+1)^2 tables are written out here as the
reference), on seeded random chains with ties, memory limits, skip tensors and every
recompute mode, and when problems share their blocks (what solve_chain keeps per set of
blocks must not leak between in-flight counts, limits or modes)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from autopipe.errors import InfeasibleError
from autopipe.partition import Edge, Partition, PartitionProblem, solve_chain
from autopipe.partition._intervals import in_bytes_matrix, position_comm, range_sums
from autopipe.partition.problem import EPS, contiguous_assignment, evaluate


def full_table_dp(p: PartitionProblem) -> Partition | None:
    """The O(S n^2) DP over full (n+1) x (n+1) tables (None: nothing fits)."""
    n, S = p.blocks, p.stages
    time, extra = range_sums(p.time_s), range_sums(p.recompute_s)
    static, act = range_sums(p.static_bytes), range_sums(p.activation_bytes)
    inb = in_bytes_matrix(p)
    empty = np.tri(n + 1, dtype=bool)
    tables = []
    for s in range(S):
        k, cap = p.inflight[s], p.stage_memory_limit[s] * (1.0 + EPS)
        plain = (static + k * act <= cap) & ~empty
        rc = (static + k * inb + act <= cap) & ~empty if p.recompute != "never" else np.zeros_like(plain)
        if p.recompute == "never":
            cost = np.where(plain, time, np.inf)
        elif p.recompute == "always":
            cost = np.where(rc, time + extra, np.inf)
        else:
            rc = rc & ~plain
            cost = np.where(plain, time, np.where(rc, time + extra, np.inf))
        tables.append((cost, rc))
    comm = position_comm(p)[1]
    f = np.full(n + 1, np.inf)
    f[0] = 0.0
    for s, (cost, _) in enumerate(tables):
        f = np.maximum((f if s == 0 else np.maximum(f, comm))[:, None], cost).min(axis=0)
    z = float(f[n])
    if not np.isfinite(z):
        return None
    bound = z + EPS * z
    comm_ok = np.where(comm <= bound, comm, np.inf)
    total, count = np.full(n + 1, np.inf), np.zeros(n + 1)
    total[0] = 0.0
    back = np.zeros((S, n + 1), dtype=np.int64)
    cols = np.arange(n + 1)
    for s, (cost, rc) in enumerate(tables):
        cand = (total if s == 0 else total + comm_ok)[:, None] + np.where(cost <= bound, cost, np.inf)
        best = cand.min(axis=0)
        near = (cand <= best + EPS * best) & np.isfinite(cand)
        recs = np.where(near, count[:, None] + rc, np.inf)
        fewest = recs.min(axis=0)
        back[s] = np.argmax(near & (recs == fewest), axis=0)
        total, count = cand[back[s], cols], fewest
    starts, j = [0] * S, n
    for s in range(S - 1, -1, -1):
        j = starts[s] = int(back[s, j])
    ends = [*starts[1:], n]
    rcs = tuple(bool(tables[s][1][starts[s], ends[s]]) for s in range(S))
    return evaluate(p, contiguous_assignment(starts, n), rcs)


def _banded(p: PartitionProblem) -> Partition | None:
    try:
        return solve_chain(p, explain=False)
    except InfeasibleError:
        return None


def _random_problem(rng: random.Random) -> PartitionProblem:
    n = rng.randint(1, 40)
    S = rng.randint(1, min(n, 16))
    time = tuple(rng.choice([1.0, 0.0, rng.uniform(0, 3), rng.uniform(0.99, 1.01)]) for _ in range(n))
    tensors = [Edge(-1, (0,), 1.0)] + [Edge(i, (i + 1,), rng.uniform(0, 2)) for i in range(n - 1)]
    for _ in range(rng.randint(0, 3) if n > 2 else 0):
        a = rng.randrange(n - 2)
        tensors.append(Edge(a, tuple(sorted({rng.randrange(a + 1, n), rng.randrange(a + 1, n)})), rng.uniform(0, 4)))
    static = tuple(rng.uniform(0, 5) for _ in range(n))
    act = tuple(rng.uniform(0, 3) for _ in range(n))
    limit = rng.choice([math.inf, (sum(static) + 3 * sum(act)) / S * rng.uniform(0.4, 3)])
    return PartitionProblem(
        time_s=time,
        recompute_s=tuple(t * rng.choice([0.0, 0.3, 0.5]) for t in time),
        static_bytes=static,
        activation_bytes=act,
        tensors=tuple(tensors),
        stages=S,
        inflight=tuple(float(rng.choice([1, 2, S - s, min(S, 4)])) for s in range(S)),
        stage_memory_limit=(limit,) * S
        if rng.random() < 0.8
        else tuple(limit * rng.uniform(0.8, 1.2) for _ in range(S)),
        link_latency_s=rng.choice([0.0, 0.01]),
        link_bandwidth=rng.choice([math.inf, 10.0]),
        recompute=rng.choice(["never", "always", "auto"]),
    )


@pytest.mark.parametrize("seed", range(4))
def test_banded_dp_equals_the_full_table_dp(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(60):
        p = _random_problem(rng)
        assert _banded(p) == full_table_dp(p)


def test_problems_sharing_blocks_get_their_own_answers() -> None:
    """One set of block tuples under many stage counts, in-flight counts, limits and modes, in
    an order that reuses (and must not confuse) what solve_chain keeps per set of blocks."""
    rng = random.Random(7)
    base = _random_problem(rng)
    while base.blocks < 24:
        base = _random_problem(rng)
    need = sum(base.static_bytes) + 2 * sum(base.activation_bytes)
    for _ in range(80):
        S = rng.randint(1, 12)
        p = replace(
            base,
            stages=S,
            inflight=tuple(float(rng.choice([1, S - s, 3])) for s in range(S)),
            stage_memory_limit=(rng.choice([math.inf, need / S * rng.uniform(0.5, 2.5)]),) * S,
            recompute=rng.choice(["never", "always", "auto"]),
        )
        assert _banded(p) == full_table_dp(p)


def test_a_long_stage_widens_the_band() -> None:
    """The least bottleneck needs a range far longer than the first band holds (cuts are cheap
    at two positions only, so the last stage takes 28 of 30 equal blocks), and the answer is
    still the full DP's."""
    n, S = 30, 3
    p = PartitionProblem(
        time_s=(1.0,) * n,
        recompute_s=(0.0,) * n,
        static_bytes=(1.0,) * n,
        activation_bytes=(1.0,) * n,
        tensors=tuple(Edge(i, (i + 1,), 0.0 if i < 2 else 1e6) for i in range(n - 1)),
        stages=S,
        inflight=(1.0,) * S,
        stage_memory_limit=(math.inf,) * S,
        link_bandwidth=10.0,
    )
    banded = _banded(p)
    assert banded is not None and banded == full_table_dp(p)
    assert banded.bottleneck_s == 28.0 and banded.boundaries == (0, 1, 2)
