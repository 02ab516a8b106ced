"""Partition solvers cross-checked on seeded random small instances (alpa-style: brute force vs
DP vs MILP vs bisection), plus hand-computed checks of the definitions and of the messages."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from autopipe.errors import InfeasibleError, PlanError
from autopipe.solve import (
    Edge,
    Partition,
    PartitionProblem,
    evaluate,
    format_bytes,
    min_memory_limit,
    solve_brute,
    solve_chain,
    solve_fast,
    solve_ilp,
)
from autopipe.solve.brute import monotone_assignments

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
        check_agree(problem, solve_or_none(solve_ilp, problem),
                    solve_or_none(solve_chain, problem), 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_ilp_matches_brute_force_on_dags(seed: int) -> None:
    rng = random.Random(200 + seed)
    for _ in range(10):  # 40 instances
        n = rng.randint(2, 9)
        problem = dag_problem(rng, n, rng.randint(1, min(4, n)))
        check_agree(problem, solve_or_none(solve_ilp, problem),
                    solve_or_none(solve_brute, problem), 1e-6)


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
        (1.0,) * 3, (0.0,) * 3, (0.0,) * 3, (0.0,) * 3,
        (Edge(0, (1, 2), 1.0),), 2, (1.0, 1.0), (math.inf,) * 2)
    assert sorted(monotone_assignments(problem)) == [
        (0, 0, 1), (0, 1, 0), (0, 1, 1)]


@pytest.mark.parametrize("seed", range(4))
def test_fast_matches_chain_bottleneck_on_larger_chains(seed: int) -> None:
    rng = random.Random(400 + seed)
    for _ in range(3):
        n = rng.randint(30, 80)
        problem = chain_problem(rng, n, rng.randint(2, 8))
        chain, fast = solve_or_none(solve_chain, problem), solve_or_none(solve_fast, problem)
        assert isinstance(fast, InfeasibleError) == isinstance(chain, InfeasibleError)
        if isinstance(fast, Partition) and isinstance(chain, Partition):
            check_valid(problem, fast)
            assert same(fast.bottleneck_s, chain.bottleneck_s)


def test_fast_solver_recovers_when_the_greedy_probe_gets_stuck() -> None:
    # Block 2 fits only on the last stage. Furthest-reach greedy puts blocks 0-1 on stage 0
    # and then cannot place block 2 on stage 1; the exact probe finds 0 | 1 | 2-4.
    act = (1.0, 1.0, 10.0, 1.0, 1.0)
    problem = PartitionProblem(
        (1.0,) * 5, (1.0,) * 5, (0.0,) * 5, act,
        tuple(Edge(i, (i + 1,), 1.0) for i in range(4)), 3, (1.0, 1.0, 1.0),
        (5.0, 5.0, 20.0), recompute="never")
    fast, chain = solve_fast(problem), solve_chain(problem)
    assert fast.stage_of_block == chain.stage_of_block == (0, 1, 2, 2, 2)
    assert fast.bottleneck_s == 3.0


def test_fast_solver_certifies_the_greedy_bottleneck() -> None:
    # Cuts at positions 3 and 5 cost 9 (comm), so at Z = 4.5 the only cuts are 1, 2, 4. The
    # greedy runs ahead (0-1 | 2-3 | 4-5 would leave stage 3 nothing) and fails at 4.5,
    # succeeding only at a larger Z; the exact probe proves 4.5 feasible.
    problem = PartitionProblem(
        (2.5, 1.5, 2.5, 1.0, 2.0, 2.5), (0.0,) * 6, (0.0,) * 6, (0.0,) * 6,
        tuple(Edge(i, (i + 1,), b) for i, b in enumerate((1.0, 1.0, 9.0, 4.0, 9.0))),
        4, (1.0,) * 4, (math.inf,) * 4, link_bandwidth=1.0, recompute="never")
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
        (1.0,) * 4, (1.0,) * 4, (0.5 * gib,) * 4, (0.0,) * 4, (), 2, (1.0, 1.0),
        (0.75 * gib, 0.75 * gib), recompute="never")
    with pytest.raises(InfeasibleError) as info:
        solve_chain(problem)
    assert str(info.value) == (
        "no partition of 4 blocks into 2 stages fits 768.0 MiB per device; the smallest limit "
        "that fits is 1.0 GiB per device (or use more stages, recomputation, or smaller "
        "micro-batches)")
    assert info.value.min_memory_bytes == gib


@pytest.mark.parametrize(("value", "up", "text"), [
    (0, False, "0 B"), (1023, False, "1023 B"), (1536, False, "1.5 KiB"),
    (2.0**30, False, "1.0 GiB"), (1.41 * 2.0**30, False, "1.4 GiB"),
    (1.41 * 2.0**30, True, "1.5 GiB"), (512 * 2.0**20, True, "512.0 MiB"),
    (math.inf, False, "unlimited"),
])
def test_format_bytes(value: float, up: bool, text: str) -> None:
    assert format_bytes(value, round_up=up) == text


# -- evaluate by hand ------------------------------------------------------------------------
def hand_problem(**changes: object) -> PartitionProblem:
    fields: dict[str, object] = dict(
        time_s=(1.0, 2.0, 3.0, 4.0),
        recompute_s=(0.5, 1.0, 1.5, 2.0),
        static_bytes=(10.0, 20.0, 30.0, 40.0),
        activation_bytes=(5.0, 6.0, 7.0, 8.0),
        tensors=(
            Edge(-1, (0,), 10.0),
            Edge(0, (1, 3), 100.0),  # skip tensor: stage 0 -> stages 1 and 2
            Edge(1, (2,), 20.0),
            Edge(2, (3,), 30.0),
        ),
        stages=3,
        inflight=(3.0, 2.0, 1.0),
        stage_memory_limit=(25.0, 263.0, 48.0),
        link_latency_s=0.5,
        link_bandwidth=100.0,
        recompute="auto",
    )
    fields.update(changes)
    return PartitionProblem(**fields)  # type: ignore[arg-type]


def test_evaluate_by_hand_with_a_skip_tensor_carried_over_two_cuts() -> None:
    part = evaluate(hand_problem(), (0, 1, 1, 2), (False, True, False))
    # cut 0 carries the skip tensor (100); cut 1 carries it again plus block 2's output (30)
    assert part.cut_bytes == (100.0, 130.0)
    assert part.comm_s == (0.5 + 1.0, 0.5 + 1.3)
    # stage 1 recomputes: times 2 + 3 plus recompute 1 + 1.5
    assert part.stage_time_s == (1.0, 7.5, 4.0)
    assert part.bottleneck_s == 7.5
    assert same(part.total_s, 12.5 + 3.3)
    # stage 0: 10 + 3*5; stage 1 (recompute): 50 + 2*in(100) + 13; stage 2: 40 + 1*8
    assert part.stage_memory_bytes == (25.0, 263.0, 48.0)
    assert part.fits and part.boundaries == (0, 1, 3) and part.recomputed_stages == 1
    # left to the auto rule, stage 1 need not recompute: 50 + 2*13 = 76 fits 263
    assert evaluate(hand_problem(), (0, 1, 1, 2)).recompute == (False, False, False)
    tight = hand_problem(stage_memory_limit=(25.0, 75.0, 48.0))  # 76 does not fit, 263 neither
    assert not evaluate(tight, (0, 1, 1, 2)).fits
    assert not evaluate(hand_problem(), (0, 1, 1, 2), (False, False, True)).fits  # 40+130+8


def test_evaluate_zero_byte_and_unlimited_links() -> None:
    problem = hand_problem(link_bandwidth=math.inf)
    assert evaluate(problem, (0, 1, 1, 2)).comm_s == (0.5, 0.5)
    zero = hand_problem(tensors=(Edge(0, (1,), 0.0), Edge(1, (2, 3), 0.0)))
    assert evaluate(zero, (0, 1, 1, 2)).comm_s == (0.0, 0.0)


@pytest.mark.parametrize(("changes", "message"), [
    (dict(recompute_s=(1.0,) * 3), "recompute_s has 3 entries but time_s has 4"),
    (dict(time_s=(), recompute_s=(), static_bytes=(), activation_bytes=()), "has no blocks"),
    (dict(stages=0), "stages must be an integer from 1 to the number of blocks (4), got 0"),
    (dict(stages=5), "stages must be an integer from 1 to the number of blocks (4), got 5"),
    (dict(inflight=(1.0, 1.0)), "inflight has 2 entries but there are 3 stages"),
    (dict(stage_memory_limit=(1.0,) * 4), "stage_memory_limit has 4 entries but there are 3 stages"),
    (dict(static_bytes=(1.0, -1.0, 1.0, 1.0)), "static_bytes[1] is -1.0"),
    (dict(time_s=(math.nan, 1.0, 1.0, 1.0)), "time_s[0] is nan"),
    (dict(activation_bytes=(1.0, 1.0, math.inf, 1.0)), "activation_bytes[2] is inf"),
    (dict(stage_memory_limit=(-1.0, 1.0, 1.0)), "stage_memory_limit[0] is -1.0"),
    (dict(link_bandwidth=0.0), "link_bandwidth must be > 0"),
    (dict(link_latency_s=-1.0), "link_latency_s[0] is -1.0"),
    (dict(recompute="sometimes"), "recompute must be 'never', 'always' or 'auto'"),
    (dict(tensors=(Edge(9, (10,), 1.0),)), "tensor 0 has src 9"),
    (dict(tensors=(Edge(2, (1,), 1.0),)), "tensor 0 (src 2) has consumer 1"),
    (dict(tensors=(Edge(0, (1,), -2.0),)), "tensor 0 bytes[0] is -2.0"),
])
def test_validation_messages(changes: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as info:
        hand_problem(**changes)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("assignment", "recompute", "message"), [
    ((0, 1, 2), None, "the assignment has 3 entries but there are 4 blocks"),
    ((0, 1, 3, 2), None, "block 2 is assigned to stage 3; stages are 0..2"),
    ((0, 0, 1, 1), None, "stage 2 has no blocks"),
    ((0, 2, 1, 2), None, "tensor 2 goes from block 1 (stage 2) back to stage 1"),
    ((0, 1, 1, 2), (True, False), "recompute has 2 entries but there are 3 stages"),
])
def test_evaluate_rejects_invalid_assignments(
    assignment: tuple[int, ...], recompute: tuple[bool, ...] | None, message: str
) -> None:
    with pytest.raises(PlanError) as info:
        evaluate(hand_problem(), assignment, recompute)
    assert message in str(info.value)


def test_evaluate_rejects_recompute_the_mode_forbids() -> None:
    with pytest.raises(PlanError, match="contradicts the problem's mode 'never'"):
        evaluate(hand_problem(recompute="never"), (0, 1, 1, 2), (False, True, False))
