"""The block method (``partition/layers.py``): every stage recomputes its first k layers whole.
Hand-counted stage terms, and the chain DP and the smallest-limit DP against brute force on
seeded random chains whose blocks are partly layers."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from autopipe.errors import PlanError
from autopipe.partition import Edge, PartitionProblem, evaluate, min_memory_limit, solve_brute, solve_chain
from autopipe.partition.layers import block_inputs, range_terms, stage_terms
from tests.partition.test_solvers import chain_problem, check_agree, solve_or_none


def _five() -> PartitionProblem:
    """An embedding, three layers and a head, each layer reading 10 bytes from the one before."""
    return PartitionProblem(
        time_s=(1.0, 3.0, 3.0, 3.0, 2.0),
        recompute_s=(0.5, 1.0, 1.0, 1.0, 0.7),
        static_bytes=(5.0, 5.0, 5.0, 5.0, 5.0),
        activation_bytes=(4.0, 40.0, 40.0, 40.0, 30.0),
        tensors=(Edge(-1, (0,), 2.0), *(Edge(i, (i + 1,), 10.0) for i in range(4))),
        stages=2,
        inflight=(2.0, 1.0),
        stage_memory_limit=(math.inf, math.inf),
        recompute="never",
        layers=(False, True, True, True, False),
        recompute_layers=1,
    )


def test_stage_terms_by_hand() -> None:
    p = _five()
    assert block_inputs(p) == (2.0, 10.0, 10.0, 10.0, 10.0)
    # stages [0, 1, 2] and [3, 4]: stage 0's first layer is block 1, stage 1's is block 3
    extra, saving, peak = stage_terms(p, (0, 0, 0, 1, 1), 2)
    assert (extra, saving, peak) == ([1.0, 1.0], [30.0, 30.0], [40.0, 40.0])
    part = evaluate(p, (0, 0, 0, 1, 1))
    assert part.stage_time_s == (7.0 + 1.0, 5.0 + 1.0)
    # static + 2 micro-batches x (84 - 30) + one layer again; static + 1 x (70 - 30) + 40
    assert part.stage_memory_bytes == (15.0 + 2 * 54.0 + 40.0, 10.0 + 40.0 + 40.0)
    two = evaluate(dataclasses.replace(p, recompute_layers=2), (0, 0, 0, 1, 1))
    assert two.stage_time_s == (9.0, 6.0)  # stage 1 has one layer only
    assert two.stage_memory_bytes == (15.0 + 2 * 24.0 + 40.0, 90.0)


def test_range_terms_equal_stage_terms() -> None:
    rng = random.Random(5)
    for _ in range(20):
        n = rng.randint(1, 9)
        p = dataclasses.replace(
            chain_problem(rng, n, 1),
            recompute="never",
            layers=tuple(rng.random() < 0.7 for _ in range(n)),
            recompute_layers=rng.randint(1, 3),
        )
        extra, saving, peak = range_terms(p, n)
        for i in range(n):
            for j in range(i + 1, n + 1):
                sub = [1 if i <= b < j else 0 for b in range(n)]
                e, s, k = stage_terms(p, sub, 2)
                assert (extra[i, j - i - 1], saving[i, j - i - 1], peak[i, j - i - 1]) == (e[1], s[1], k[1])


def _layered(rng: random.Random, n: int, stages: int) -> PartitionProblem:
    p = chain_problem(rng, n, stages)
    return dataclasses.replace(
        p,
        recompute="never",
        layers=tuple(rng.random() < 0.75 for _ in range(n)),
        recompute_layers=rng.randint(1, 3),
        stage_memory_limit=(math.inf,) * stages,
    )


@pytest.mark.parametrize("seed", range(8))
def test_chain_dp_matches_brute_force_with_the_block_method(seed: int) -> None:
    rng = random.Random(900 + seed)
    for _ in range(25):  # 200 instances
        n = rng.randint(1, 11)
        p = _layered(rng, n, rng.randint(1, min(4, n)))
        need = min_memory_limit(p)
        limits = rng.choice([(math.inf,) * p.stages, (need * rng.uniform(0.9, 1.4),) * p.stages])
        p = dataclasses.replace(p, stage_memory_limit=limits)
        brute = solve_or_none(solve_brute, p)
        check_agree(p, solve_or_none(solve_chain, p), brute)


def test_the_block_method_is_the_stages_one_recomputation() -> None:
    p = _five()
    with pytest.raises(PlanError, match="recompute 'never'"):
        dataclasses.replace(p, recompute="auto")
    with pytest.raises(PlanError, match="one layers flag per block"):
        dataclasses.replace(p, layers=(True,))
