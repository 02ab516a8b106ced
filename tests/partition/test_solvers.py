"""The partition solvers cross-checked: chain DP, ILP, the fast solver and brute force on seeded
random cases (the fast solver's checks on both its paths, C probe and Python twin: the
``native_and_python`` fixture)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from autopipe.errors import InfeasibleError
from autopipe.partition import (
    Edge,
    Partition,
    PartitionProblem,
    evaluate,
    min_memory_limit,
    solve_brute,
    solve_chain,
    solve_fast,
    solve_ilp,
)
from autopipe.partition.brute import monotone_assignments

REL = 1e-9
MODES = ("never", "always", "auto")


# -- instance generators ---------------------------------------------------------------------
def _costs(rng: random.Random, n: int, stages: int, tensors: list[Edge]) -> PartitionProblem:
    """Random costs around ``tensors``; memory limits around the smallest that fits (so some
    instances are infeasible), sometimes different per stage, sometimes unlimited."""
    S = stages
    base = PartitionProblem(
        time_s=tuple(rng.uniform(1, 4) for _ in range(n)),
        recompute_s=tuple(rng.uniform(0.2, 1.5) for _ in range(n)),
        static_bytes=tuple(rng.uniform(0, 50) for _ in range(n)),
        activation_bytes=tuple(rng.uniform(0, 60) for _ in range(n)),
        tensors=tuple(tensors),
        stages=S,
        inflight=tuple(float(min(rng.randint(1, 8), S - s)) for s in range(S)),
        stage_memory_limit=(math.inf,) * S,
        link_latency_s=rng.choice([0.0, 0.0, 0.3]),
        link_bandwidth=rng.choice([math.inf, 10.0, 40.0]),
        recompute=rng.choice(MODES),
    )
    roll = rng.random()
    if roll < 0.15:
        return base
    need = min_memory_limit(base)
    if roll < 0.7:
        limits = (need * rng.uniform(0.9, 1.4),) * S
    else:
        limits = tuple(need * rng.uniform(0.9, 1.8) for _ in range(S))
    return dataclasses.replace(base, stage_memory_limit=limits)


def chain_problem(rng: random.Random, n: int, stages: int) -> PartitionProblem:
    """A chain (every block feeds the next) with random skip tensors, carried over cuts:
    monotone assignments are exactly the contiguous ones."""
    tensors = [Edge(-1, (0,), rng.uniform(1, 20))]
    tensors += [Edge(i, (i + 1,), rng.uniform(1, 20)) for i in range(n - 1)]
    for _ in range(rng.randint(0, 3) if n > 2 else 0):
        a = rng.randrange(n - 2)
        later = list(range(a + 2, n))
        dsts = tuple(sorted(rng.sample(later, rng.randint(1, min(2, len(later))))))
        tensors.append(Edge(a, dsts, rng.uniform(1, 20)))
    if n > 1 and rng.random() < 0.3:
        tensors.append(Edge(-1, (rng.randrange(1, n),), rng.uniform(1, 20)))  # a 2nd input
    return _costs(rng, n, stages, tensors)


def dag_problem(rng: random.Random, n: int, stages: int) -> PartitionProblem:
    """A random DAG (branches, so monotone assignments need not be contiguous)."""
    consumers: dict[int, set[int]] = {i: set() for i in range(n)}
    for b in range(1, n):
        consumers[rng.randrange(b)].add(b)
    for b in range(n - 1):
        if rng.random() < 0.3:
            consumers[b].add(rng.randrange(b + 1, n))
    tensors = [Edge(-1, (0,), rng.uniform(1, 20))]
    tensors += [Edge(i, tuple(sorted(c)), rng.uniform(1, 20)) for i, c in consumers.items() if c]
    return _costs(rng, n, stages, tensors)


def solve_or_none(solver: object, problem: PartitionProblem) -> Partition | InfeasibleError:
    try:
        return solver(problem)  # type: ignore[operator, no-any-return]
    except InfeasibleError as err:
        return err


def same(a: float, b: float, rel: float = REL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def check_valid(problem: PartitionProblem, part: Partition) -> None:
    """The partition is a valid assignment that fits, and its numbers are evaluate's."""
    assert part.fits
    assert part == evaluate(problem, part.stage_of_block, part.recompute)
    assert sorted(set(part.stage_of_block)) == list(range(problem.stages))


def check_agree(problem: PartitionProblem, a: object, b: object, rel: float = REL) -> None:
    assert isinstance(a, InfeasibleError) == isinstance(b, InfeasibleError), (problem, a, b)
    if isinstance(a, InfeasibleError) and isinstance(b, InfeasibleError):
        assert a.min_memory_bytes is not None and b.min_memory_bytes is not None
        assert same(a.min_memory_bytes, b.min_memory_bytes, 1e-6)
        return
    assert isinstance(a, Partition) and isinstance(b, Partition)
    check_valid(problem, a)
    check_valid(problem, b)
    assert same(a.bottleneck_s, b.bottleneck_s, rel), (problem, a, b)
    assert same(a.total_s, b.total_s, rel), (problem, a, b)


# -- cross-checks ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_chain_dp_matches_brute_force_and_fast_matches_its_bottleneck(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):  # 300 instances in all
        n = rng.randint(1, 12)
        problem = chain_problem(rng, n, rng.randint(1, min(4, n)))
        brute = solve_or_none(solve_brute, problem)
        chain = solve_or_none(solve_chain, problem)
        check_agree(problem, chain, brute)
        if isinstance(chain, Partition) and isinstance(brute, Partition):
            assert chain.recomputed_stages == brute.recomputed_stages
        fast = solve_or_none(solve_fast, problem)
        assert isinstance(fast, InfeasibleError) == isinstance(chain, InfeasibleError)
        if isinstance(fast, Partition) and isinstance(chain, Partition):
            check_valid(problem, fast)
            assert same(fast.bottleneck_s, chain.bottleneck_s)
            assert fast.total_s >= chain.total_s * (1 - REL)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_ilp_matches_chain_dp_on_chains(seed: int) -> None:
    rng = random.Random(100 + seed)
    for _ in range(10):  # 40 instances
        n = rng.randint(2, 10)
        problem = chain_problem(rng, n, rng.randint(1, min(4, n)))
        check_agree(problem, solve_or_none(solve_ilp, problem), solve_or_none(solve_chain, problem), 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_ilp_matches_brute_force_on_dags(seed: int) -> None:
    rng = random.Random(200 + seed)
    for _ in range(10):  # 40 instances
        n = rng.randint(2, 9)
        problem = dag_problem(rng, n, rng.randint(1, min(4, n)))
        check_agree(problem, solve_or_none(solve_ilp, problem), solve_or_none(solve_brute, problem), 1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_contiguous_solvers_are_never_better_than_brute_force_on_dags(seed: int) -> None:
    rng = random.Random(300 + seed)
    for _ in range(20):  # 120 instances
        n = rng.randint(2, 9)
        problem = dag_problem(rng, n, rng.randint(1, min(4, n)))
        brute = solve_or_none(solve_brute, problem)
        for solver in (solve_chain, solve_fast):
            got = solve_or_none(solver, problem)
            if isinstance(got, Partition):
                check_valid(problem, got)
                assert isinstance(brute, Partition)  # contiguous ones are monotone
                assert got.bottleneck_s >= brute.bottleneck_s * (1 - REL)
                if same(got.bottleneck_s, brute.bottleneck_s) and solver is solve_chain:
                    assert got.total_s >= brute.total_s * (1 - REL)
            elif isinstance(brute, InfeasibleError):
                assert got.min_memory_bytes is not None and brute.min_memory_bytes is not None
                assert got.min_memory_bytes >= brute.min_memory_bytes * (1 - REL)


def test_brute_force_enumerates_non_contiguous_assignments() -> None:
    # 0 -> 1, 0 -> 2: blocks 1 and 2 are independent branches
    problem = PartitionProblem(
        (1.0,) * 3, (0.0,) * 3, (0.0,) * 3, (0.0,) * 3, (Edge(0, (1, 2), 1.0),), 2, (1.0, 1.0), (math.inf,) * 2
    )
    assert sorted(monotone_assignments(problem)) == [(0, 0, 1), (0, 1, 0), (0, 1, 1)]


@pytest.mark.parametrize("seed", range(4))
def test_fast_matches_chain_bottleneck_on_larger_chains(seed: int, native_and_python: str) -> None:
    rng = random.Random(400 + seed)
    for _ in range(3):
        n = rng.randint(30, 80)
        problem = chain_problem(rng, n, rng.randint(2, 8))
        chain, fast = solve_or_none(solve_chain, problem), solve_or_none(solve_fast, problem)
        assert isinstance(fast, InfeasibleError) == isinstance(chain, InfeasibleError)
        if isinstance(fast, Partition) and isinstance(chain, Partition):
            check_valid(problem, fast)
            assert same(fast.bottleneck_s, chain.bottleneck_s)


def test_fast_solver_recovers_when_the_greedy_probe_gets_stuck(native_and_python: str) -> None:
    # Block 2 fits only on the last stage. Furthest-reach greedy puts blocks 0-1 on stage 0
    # and then cannot place block 2 on stage 1; the exact probe finds 0 | 1 | 2-4.
    act = (1.0, 1.0, 10.0, 1.0, 1.0)
    problem = PartitionProblem(
        (1.0,) * 5,
        (1.0,) * 5,
        (0.0,) * 5,
        act,
        tuple(Edge(i, (i + 1,), 1.0) for i in range(4)),
        3,
        (1.0, 1.0, 1.0),
        (5.0, 5.0, 20.0),
        recompute="never",
    )
    fast, chain = solve_fast(problem), solve_chain(problem)
    assert fast.stage_of_block == chain.stage_of_block == (0, 1, 2, 2, 2)
    assert fast.bottleneck_s == 3.0


def test_fast_solver_certifies_the_greedy_bottleneck(native_and_python: str) -> None:
    # Cuts at positions 3 and 5 cost 9 (comm), so at Z = 4.5 the only cuts are 1, 2, 4. The
    # greedy runs ahead (0-1 | 2-3 | 4-5 would leave stage 3 nothing) and fails at 4.5,
    # succeeding only at a larger Z; the exact probe proves 4.5 feasible.
    problem = PartitionProblem(
        (2.5, 1.5, 2.5, 1.0, 2.0, 2.5),
        (0.0,) * 6,
        (0.0,) * 6,
        (0.0,) * 6,
        tuple(Edge(i, (i + 1,), b) for i, b in enumerate((1.0, 1.0, 9.0, 4.0, 9.0))),
        4,
        (1.0,) * 4,
        (math.inf,) * 4,
        link_bandwidth=1.0,
        recompute="never",
    )
    fast, chain = solve_fast(problem), solve_chain(problem)
    assert fast.stage_of_block == chain.stage_of_block == (0, 1, 2, 2, 3, 3)
    assert fast.bottleneck_s == chain.bottleneck_s == 4.5


# -- infeasibility and the smallest limit ----------------------------------------------------
@pytest.mark.parametrize("seed", range(3))
def test_min_memory_limit_is_tight_and_named_by_every_solver(seed: int) -> None:
    rng = random.Random(500 + seed)
    for case in range(10):
        n = rng.randint(2, 10)
        problem = chain_problem(rng, n, rng.randint(1, min(4, n)))
        need = min_memory_limit(problem)
        at = dataclasses.replace(problem, stage_memory_limit=(need,) * problem.stages)
        below = dataclasses.replace(problem, stage_memory_limit=(need * (1 - 1e-6),) * problem.stages)
        solvers = [solve_chain, solve_fast, solve_brute]
        if case < 3:
            solvers.append(solve_ilp)
        for solver in solvers:
            check_valid(at, solver(at))
            with pytest.raises(InfeasibleError) as info:
                solver(below)
            assert info.value.min_memory_bytes is not None
            assert same(info.value.min_memory_bytes, need, 1e-6)
            assert "\n" not in str(info.value)


def test_infeasible_message() -> None:
    gib = 2.0**30
    problem = PartitionProblem(
        (1.0,) * 4,
        (1.0,) * 4,
        (0.5 * gib,) * 4,
        (0.0,) * 4,
        (),
        2,
        (1.0, 1.0),
        (0.75 * gib, 0.75 * gib),
        recompute="never",
    )
    with pytest.raises(InfeasibleError) as info:
        solve_chain(problem)
    assert str(info.value) == (
        "no partition of 4 blocks into 2 stages fits 768.0 MiB per device; the smallest limit "
        "that fits is 1.0 GiB per device (or use more stages, recomputation, or smaller "
        "micro-batches)"
    )
    assert info.value.min_memory_bytes == gib
