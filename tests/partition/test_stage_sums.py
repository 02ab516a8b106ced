"""The numpy per-stage sums (large assignments) against the loop in problem.py: the same
floats to the last bit and the same first error, on seeded random block graphs."""

from __future__ import annotations

import random

import pytest

from autopipe.errors import PlanError
from autopipe.partition.problem import (
    Edge,
    PartitionProblem,
    StageStats,
    _stage_stats_py,
    comm_time,
)
from autopipe.partition.stage_sums import stage_sums


def _problem(rng: random.Random, n: int, stages: int) -> PartitionProblem:
    """A random DAG: model inputs, tensors with several consumers, one with none."""
    tensors = [Edge(-1, tuple(sorted(rng.sample(range(n), rng.randint(1, 3)))), rng.uniform(1, 1e6))]
    for src in range(n - 1):
        for _ in range(rng.choice((1, 1, 2))):
            dsts = tuple(sorted(rng.sample(range(src + 1, n), min(n - src - 1, rng.randint(1, 3)))))
            tensors.append(Edge(src, dsts, rng.uniform(0, 1e7)))
    tensors.append(Edge(n // 2, (), 5.0))

    def per_block() -> tuple[float, ...]:
        return tuple(rng.uniform(0, 1e-2) for _ in range(n))

    return PartitionProblem(
        per_block(),
        per_block(),
        per_block(),
        per_block(),
        tuple(tensors),
        stages,
        (1.0,) * stages,
        (float("inf"),) * stages,
        1e-5,
        1e9,
    )


def _numpy(p: PartitionProblem, assign: tuple[int, ...]) -> StageStats:
    blocks = (p.time_s, p.recompute_s, p.static_bytes, p.activation_bytes)
    (time, extra, static, act), in_bytes, cut = stage_sums(blocks, p.tensors, p.stages, assign)
    return StageStats(time, extra, static, act, in_bytes, cut, tuple(comm_time(p, b) for b in cut))


def _seeded(seed: int, blocks: tuple[int, int], stages: tuple[int, int]) -> tuple[random.Random, PartitionProblem]:
    """A seeded random problem (blocks and stages in the given ranges, stages at most the
    blocks) and the generator, to draw its assignments."""
    rng = random.Random(seed)
    n = rng.randint(*blocks)
    return rng, _problem(rng, n, rng.randint(stages[0], min(n, stages[1])))


def _monotone(rng: random.Random, n: int, stages: int) -> tuple[int, ...]:
    cuts = sorted(rng.sample(range(1, n), stages - 1))
    return tuple(sum(i >= c for c in cuts) for i in range(n))


@pytest.mark.parametrize("seed", range(40))
def test_the_numpy_sums_equal_the_loop_to_the_last_bit(seed: int) -> None:
    rng, p = _seeded(seed, (2, 90), (1, 9))
    for _ in range(5):
        assign = _monotone(rng, p.blocks, p.stages)
        assert _numpy(p, assign) == _stage_stats_py(p, assign)


@pytest.mark.parametrize("seed", range(40))
def test_the_numpy_sums_raise_the_loops_first_error(seed: int) -> None:
    rng, p = _seeded(seed, (4, 60), (2, 6))
    n, stages = p.blocks, p.stages
    assign = list(_monotone(rng, n, stages))
    how = seed % 3
    if how == 0:  # out of range
        assign[rng.randrange(n)] = rng.choice((-1, stages))
    elif how == 1:  # a stage left empty
        assign = [min(s, stages - 2) for s in assign]
    else:  # a tensor going back
        assign = [stages - 1 - s for s in assign]
    with pytest.raises(PlanError) as loop:
        _stage_stats_py(p, tuple(assign))
    with pytest.raises(PlanError) as vector:
        _numpy(p, tuple(assign))
    assert str(vector.value) == str(loop.value)
