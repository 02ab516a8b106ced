"""partition/reach.py's proof that nothing fits: every proof agrees with the chain DP (and, on
the block method, brute force); without recomputation, where every block fits every chunk
alone, it finds every infeasible problem but those within the tolerances of the limit."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from autopipe.errors import InfeasibleError
from autopipe.partition import Edge, PartitionProblem, solve_brute, solve_chain
from autopipe.partition.min_memory import min_memory_limit
from autopipe.partition.reach import cannot_fit


def _fits(p: PartitionProblem, brute: bool = False) -> bool:
    try:
        solve_brute(p) if brute else solve_chain(p, explain=False)
    except InfeasibleError:
        return False
    return True


def _problem(rng: random.Random, n: int, stages: int, recompute: str) -> PartitionProblem:
    static = tuple(rng.choice([0.0, rng.uniform(0, 5)]) for _ in range(n))
    act = tuple(rng.uniform(0, 3) for _ in range(n))
    p = PartitionProblem(
        time_s=tuple(rng.uniform(0, 2) for _ in range(n)),
        recompute_s=tuple(rng.uniform(0, 1) for _ in range(n)),
        static_bytes=static,
        activation_bytes=act,
        tensors=(Edge(-1, (0,), 1.0), *(Edge(i, (i + 1,), rng.uniform(0, 2)) for i in range(n - 1))),
        stages=stages,
        inflight=tuple(float(rng.choice([1, 2, stages - s, 0.5])) for s in range(stages)),
        stage_memory_limit=(math.inf,) * stages,
        recompute=recompute,
    )
    need = min_memory_limit(p)  # limits around the least that fits, above and below
    limits = [need * rng.uniform(0.5, 1.5) * rng.choice([1.0, rng.uniform(0.8, 1.2)]) for _ in range(stages)]
    return dataclasses.replace(p, stage_memory_limit=tuple(limits))


@pytest.mark.parametrize("recompute", ["never", "auto", "always"])
def test_a_proof_is_never_wrong_and_without_recomputation_it_misses_nothing(recompute: str) -> None:
    rng = random.Random({"never": 1, "auto": 2, "always": 3}[recompute])
    proved = infeasible = 0
    for _ in range(300):
        n = rng.randint(1, 30)
        p = _problem(rng, n, rng.randint(1, min(n, 8)), recompute)
        fits = _fits(p)
        if cannot_fit(p):
            assert not fits, p
            proved += 1
        infeasible += not fits
        near = tuple(x * (1 - 1e-5) for x in p.stage_memory_limit)
        alone = all(
            s + k * a <= limit
            for s, a in zip(p.static_bytes, p.activation_bytes, strict=True)
            for k, limit in zip(p.inflight, near, strict=True)
        )
        if recompute == "never" and not fits and alone:  # the walk is exact here, up to the tolerances
            assert cannot_fit(dataclasses.replace(p, stage_memory_limit=near))
    assert proved > 0 and infeasible > 0


@pytest.mark.parametrize("seed", range(3))
def test_a_proof_is_never_wrong_with_the_block_method(seed: int) -> None:
    rng = random.Random(40 + seed)
    proved = 0
    for _ in range(120):
        n = rng.randint(1, 10)
        p = _problem(rng, n, rng.randint(1, min(n, 4)), "never")
        p = dataclasses.replace(
            p, layers=tuple(rng.random() < 0.75 for _ in range(n)), recompute_layers=rng.randint(1, 3)
        )
        if cannot_fit(p):
            assert not _fits(p, brute=True) and not _fits(p)
            proved += 1
    assert proved > 0


def test_a_limit_of_inf_always_may_fit_and_one_too_small_never_does() -> None:
    p = PartitionProblem(
        time_s=(1.0,) * 4,
        recompute_s=(0.5,) * 4,
        static_bytes=(2.0,) * 4,
        activation_bytes=(1.0,) * 4,
        tensors=(),
        stages=2,
        inflight=(2.0, 1.0),
        stage_memory_limit=(math.inf, math.inf),
        recompute="never",
    )
    assert not cannot_fit(p)
    # stage 0 holds 2 + 2 x 1 per block, stage 1 3 per block: 8 + 6 or 4 + 9 at best
    assert not cannot_fit(dataclasses.replace(p, stage_memory_limit=(8.0, 6.0)))
    assert cannot_fit(dataclasses.replace(p, stage_memory_limit=(7.9, 6.0)))
    assert cannot_fit(dataclasses.replace(p, stage_memory_limit=(8.0, 5.9)))
