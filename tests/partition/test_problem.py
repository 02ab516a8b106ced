"""The partition problem: evaluating an assignment by hand, validation messages, byte formatting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autopipe.errors import PlanError
from autopipe.partition import (
    Edge,
    PartitionProblem,
    evaluate,
    format_bytes,
)

REL = 1e-9


def same(a: float, b: float, rel: float = REL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


@pytest.mark.parametrize(
    ("value", "up", "text"),
    [
        (0, False, "0 B"),
        (1023, False, "1023 B"),
        (1536, False, "1.5 KiB"),
        (2.0**30, False, "1.0 GiB"),
        (1.41 * 2.0**30, False, "1.4 GiB"),
        (1.41 * 2.0**30, True, "1.5 GiB"),
        (512 * 2.0**20, True, "512.0 MiB"),
        (math.inf, False, "unlimited"),
    ],
)
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


@pytest.mark.parametrize(
    ("changes", "message"),
    [
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
    ],
)
def test_validation_messages(changes: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as info:
        hand_problem(**changes)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("assignment", "recompute", "message"),
    [
        ((0, 1, 2), None, "the assignment has 3 entries but there are 4 blocks"),
        ((0, 1, 3, 2), None, "block 2 is assigned to stage 3; stages are 0..2"),
        ((0, 0, 1, 1), None, "stage 2 has no blocks"),
        ((0, 2, 1, 2), None, "tensor 2 goes from block 1 (stage 2) back to stage 1"),
        ((0, 1, 1, 2), (True, False), "recompute has 2 entries but there are 3 stages"),
    ],
)
def test_evaluate_rejects_invalid_assignments(
    assignment: tuple[int, ...], recompute: tuple[bool, ...] | None, message: str
) -> None:
    with pytest.raises(PlanError) as info:
        evaluate(hand_problem(), assignment, recompute)
    assert message in str(info.value)


def test_evaluate_rejects_recompute_the_mode_forbids() -> None:
    with pytest.raises(PlanError, match="contradicts the problem's mode 'never'"):
        evaluate(hand_problem(recompute="never"), (0, 1, 1, 2), (False, True, False))


def test_one_fits_in_memory_rule_with_named_tolerances() -> None:
    from autopipe.partition.problem import EPS, SCREEN_SLACK, memory_cap, memory_fits

    limit = 3.0 * 2**30
    assert memory_cap(limit) == limit * (1.0 + EPS)
    assert memory_fits(limit * (1.0 + EPS), limit) and not memory_fits(limit * (1.0 + 2 * EPS), limit)
    assert memory_fits(limit * (1.0 + SCREEN_SLACK), limit, SCREEN_SLACK)
    assert not memory_fits(limit * (1.0 + 2 * SCREEN_SLACK), limit, SCREEN_SLACK)
    assert memory_fits(1e30, math.inf)
    caps = memory_cap(np.array([1.0, 2.0, math.inf]))  # the same arithmetic on arrays
    assert caps.tolist() == [memory_cap(1.0), memory_cap(2.0), math.inf]


def test_no_other_copy_of_the_memory_tolerances() -> None:
    """The tolerances are written once (partition/problem.py); every other module names them."""
    import re
    from pathlib import Path

    import autopipe

    root = Path(autopipe.__file__).parent
    for path in [*(root / "partition").glob("*.py"), *(root / "planner").glob("*.py")]:
        if path.name == "problem.py":
            continue
        text = path.read_text()
        assert not re.search(r"MEMORY_SLACK|(limit\w*|\)|\])\s*\*\s*\(1(\.0)? \+ ", text), path.name  # memory_cap
        assert not re.search(r"limit\w* / \w+\.virtual|limit\(\w+\) \* v\b", text), (
            path.name
        )  # splits.chunk_limit, device_limit
