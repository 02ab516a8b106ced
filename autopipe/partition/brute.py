"""Brute force over every monotone assignment and every recompute choice: the test oracle.

Enumerates block-by-block (in the given topological order, each block at or after the stage of
every block it reads from), prices each assignment with the same per-stage sums
:func:`~autopipe.partition.problem.evaluate` uses, tries every recompute vector the mode allows
(2^S in "auto"), and keeps the lexicographic best (Z, total, recomputed stages), floats
compared with relative tolerance EPS. When nothing fits, the smallest limit it reports is the
minimum over all monotone assignments (not only contiguous ones). Exponential: for tests (n <= ~12, S <= 4).

Tests: tests/partition/test_solvers.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from autopipe.partition.min_memory import infeasible_error
from autopipe.partition.problem import (
    EPS,
    Partition,
    PartitionProblem,
    evaluate,
    memory_fits,
    stage_stats,
)

__all__ = ["monotone_assignments", "solve_brute"]


def monotone_assignments(problem: PartitionProblem) -> Iterator[tuple[int, ...]]:
    """Every assignment monotone along the tensors with no empty stage, in lexicographic order."""
    n, S = problem.blocks, problem.stages
    producers: list[set[int]] = [set() for _ in range(n)]
    for t in problem.tensors:
        if t.src >= 0:
            for d in t.dsts:
                producers[d].add(t.src)
    stage = [0] * n

    def rec(i: int, used: frozenset[int]) -> Iterator[tuple[int, ...]]:
        if S - len(used) > n - i:
            return
        if i == n:
            yield tuple(stage)
            return
        lo = max((stage[q] for q in producers[i]), default=0)
        for s in range(lo, S):
            stage[i] = s
            yield from rec(i + 1, used | {s})

    yield from rec(0, frozenset())


def solve_brute(problem: PartitionProblem) -> Partition:
    """The lexicographically best monotone assignment, by exhaustive search."""
    p = problem
    choices = {
        "never": [(False,) * p.stages],
        "always": [(True,) * p.stages],
        "auto": list(itertools.product((False, True), repeat=p.stages)),
    }[p.recompute]
    found: list[tuple[float, float, int, tuple[int, ...], tuple[bool, ...]]] = []
    need = float("inf")  # smallest single limit under which some assignment fits
    for assign in monotone_assignments(p):
        st = stage_stats(p, assign)
        need = min(need, max(min(st.memory(p, s, r) for r in {rc[s] for rc in choices}) for s in range(p.stages)))
        for rc in choices:
            if not all(memory_fits(st.memory(p, s, rc[s]), p.stage_memory_limit[s]) for s in range(p.stages)):
                continue
            times = [st.time_of(s, rc[s]) for s in range(p.stages)]
            z = max(max(times), max(st.comm, default=0.0))
            found.append((z, sum(times) + sum(st.comm), sum(rc), assign, rc))
    if not found:
        raise infeasible_error(p, need)
    z = min(f[0] for f in found)
    found = [f for f in found if f[0] <= z + EPS * z]
    total = min(f[1] for f in found)
    found = [f for f in found if f[1] <= total + EPS * total]
    best = min(found, key=lambda f: f[2])
    return evaluate(p, best[3], best[4])
