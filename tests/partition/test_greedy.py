"""The bisection solver's two shortcuts for the search: a tolerance on the bottleneck, and the
memory reach kept across problems on the same blocks (``solve_fast(tolerance=, memo=)``),
checked against the exact solver on seeded random chains (on both paths: the
``native_and_python`` fixture); and its C probe (_probe.c) against the Python twin, bit for bit."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from autopipe import native
from autopipe.errors import InfeasibleError
from autopipe.partition import Edge, Partition, PartitionProblem, evaluate, greedy, solve_fast
from autopipe.partition._intervals import prefix
from autopipe.partition.greedy import Memo


def blocks(rng: random.Random, n: int) -> PartitionProblem:
    """n random blocks in a chain with a skip tensor, as one stage (stages, in-flight counts and
    limits are set per case)."""
    tensors = [
        Edge(-1, (0,), 5.0),
        *(Edge(i, (i + 1,), rng.uniform(1, 20)) for i in range(n - 1)),
        Edge(0, (n - 1,), 3.0),
    ]
    return PartitionProblem(
        time_s=tuple(rng.uniform(1, 4) for _ in range(n)),
        recompute_s=tuple(rng.uniform(0.2, 1.5) for _ in range(n)),
        static_bytes=tuple(rng.uniform(0, 50) for _ in range(n)),
        activation_bytes=tuple(rng.uniform(0, 60) for _ in range(n)),
        tensors=tuple(tensors),
        stages=1,
        inflight=(1.0,),
        stage_memory_limit=(math.inf,),
        link_latency_s=0.1,
        link_bandwidth=40.0,
        recompute="auto",
    )


def on(base: PartitionProblem, rng: random.Random) -> PartitionProblem:
    """The same blocks cut into another number of stages, with other in-flight counts and limits."""
    S = rng.randint(2, 8)
    inflight = tuple(float(rng.choice([1, 2, 3, S - s if s < S else 1])) for s in range(S))
    cap = sum(base.static_bytes) / S * rng.uniform(1.5, 4) + max(base.activation_bytes) * rng.uniform(1, 6)
    return dataclasses.replace(base, stages=S, inflight=inflight, stage_memory_limit=(cap,) * S)


def solved(problem: PartitionProblem, **kw: object) -> Partition | None:
    try:
        return solve_fast(problem, explain=False, **kw)  # type: ignore[arg-type]
    except InfeasibleError:
        return None


def test_a_memo_changes_nothing_and_a_tolerance_stays_within_it(native_and_python: str) -> None:
    rng = random.Random(7)
    checked = 0
    for _ in range(12):
        base = blocks(rng, rng.randint(30, 60))
        memo = Memo()  # kept across every problem on these blocks, as the search keeps it per micro-batch size
        for _ in range(6):
            p = on(base, rng)
            exact = solved(p)
            assert solved(p, memo=memo) == exact
            loose = solved(p, memo=memo, tolerance=1e-6)
            assert (loose is None) == (exact is None)
            if exact is not None and loose is not None:
                assert loose.fits and loose == evaluate(p, loose.stage_of_block, loose.recompute)
                assert exact.bottleneck_s <= loose.bottleneck_s <= exact.bottleneck_s * (1 + 1e-6)
                checked += 1
        assert memo.plain and memo.in_bytes
    assert checked > 30


def random_problem(rng: random.Random) -> PartitionProblem:
    """Random blocks, stages, in-flight counts, per-stage limits (or none) and recompute mode."""
    base = blocks(rng, rng.randint(8, 80))
    S = rng.randint(1, min(12, base.blocks))
    inflight = tuple(float(rng.randint(1, S + 1)) for _ in range(S))
    per = sum(base.static_bytes) / S + max(base.activation_bytes)
    limits = tuple(per * rng.uniform(0.8, 5) for _ in range(S)) if rng.random() < 0.8 else (math.inf,) * S
    mode = rng.choice(["auto", "always", "never"])
    return dataclasses.replace(base, stages=S, inflight=inflight, stage_memory_limit=limits, recompute=mode)


@pytest.mark.skipif(not native.available(native.PROBE), reason="the C probe is not built (no C compiler at install)")
def test_the_c_probe_gives_the_python_twins_partition_to_the_last_bit() -> None:
    rng = random.Random(11)
    stuck = found = 0
    for _ in range(100):
        p = random_problem(rng)
        probes = greedy._Probes(p, Memo())
        lower = greedy._lower(p, float(probes.pt[-1]))
        for tolerance in (0.0, 1e-6, 1e-2):
            start = probes.greedy(math.inf)
            twin = None if start is None else greedy._bisect(probes.greedy, lower, start, tolerance)
            assert probes.native(lower, tolerance) == twin  # starts, recompute flags, largest piece
            stuck, found = stuck + (twin is None), found + (twin is not None)
        with native.python_twins():
            python, twin_tables = solved(p), greedy._Probes(p, Memo())
            twin_tables._tables()  # the memory reach tables, numpy's searches
        assert solved(p) == python
        c_tables = greedy._Probes(p, Memo())
        c_tables._tables()  # the C's
        for a, b in ((c_tables.memo.plain, twin_tables.memo.plain), (c_tables.memo.rc, twin_tables.memo.rc)):
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert stuck > 50 and found > 150  # both ways out are checked


def test_the_lower_bracket_stays_below_the_least_bottleneck() -> None:
    """Z* by brute force over every cut (no memory, no comm), in the solver's arithmetic (prefix
    differences): often below max(longest block, total / S) by a rounding, never below ``_lower``."""
    rng = random.Random(5)
    rounded = 0
    for _ in range(1000):
        S, n = rng.randint(1, 4), rng.randint(4, 7)
        times = tuple(rng.choice([0.1, 0.2, 0.3, 0.7, 1 / 3, 1.1]) * rng.choice([1, 3, 7]) for _ in range(n))
        p = dataclasses.replace(
            blocks(rng, n), time_s=times, stages=S, inflight=(1.0,) * S, stage_memory_limit=(math.inf,) * S
        )
        pt = prefix(times).tolist()
        least = min(
            max(pt[b] - pt[a] for a, b in zip((0, *cuts), (*cuts, n), strict=True))
            for cuts in itertools.combinations(range(1, n), S - 1)
        )
        assert greedy._lower(p, pt[-1]) < least
        rounded += least < max(max(times), pt[-1] / S)
    assert rounded > 20  # the bracket's margin is needed


def test_the_c_probe_mirrors_the_python_bisection_gap() -> None:
    source = (Path(greedy.__file__).parent / "_probe.c").read_text()
    found = re.search(r"^#define BISECT_GAP (\S+)$", source, re.MULTILINE)
    assert found is not None, "_probe.c defines BISECT_GAP"
    assert float(found.group(1)) == greedy.BISECT_GAP
    assert "1e-12" not in source.replace("#define BISECT_GAP 1e-12", "")  # no other copy of it
