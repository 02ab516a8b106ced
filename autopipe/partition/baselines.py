"""The simple splits people use today, priced beside autopipe's plan.

- ``even-layers``: the same number of blocks (about layers) on every stage;
- ``by-params``: contiguous stages balancing parameter counts (DeepSpeed's "parameters"
  method: the embedding and LM head throw it off, since their parameters cost little time);
- ``greedy-time``: cut where the running time first passes each k/S share of the total.

Tests: tests/partition/test_solvers.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autopipe.partition.greedy import solve_fast
from autopipe.partition.problem import PartitionProblem, contiguous_assignment

__all__ = ["BASELINES", "baseline_assignment"]

BASELINES = ("even-layers", "by-params", "greedy-time")


def baseline_assignment(name: str, params: tuple[float, ...], times: Sequence[float], stages: int) -> tuple[int, ...]:
    """The stage of each block under the simple split ``name`` (one of :data:`BASELINES`)."""
    n = len(params)
    if name == "even-layers":
        bounds = [round(s * n / stages) for s in range(stages)]
    elif name == "by-params":
        bounds = list(_min_max_split(params, stages))
    elif name == "greedy-time":
        bounds = _greedy_split(times, stages)
    else:
        raise ValueError(f"unknown baseline {name!r}; use one of {', '.join(BASELINES)}")
    return contiguous_assignment(bounds, n)


def _min_max_split(weights: tuple[float, ...], S: int) -> tuple[int, ...]:
    """Contiguous split minimising the largest part (DeepSpeed's 'parameters' method)."""
    n = len(weights)
    p = PartitionProblem(
        time_s=weights,
        recompute_s=(0.0,) * n,
        static_bytes=(0.0,) * n,
        activation_bytes=(0.0,) * n,
        tensors=(),
        stages=S,
        inflight=(0.0,) * S,
        stage_memory_limit=(math.inf,) * S,
        recompute="never",
    )
    return solve_fast(p).boundaries


def _greedy_split(times: Sequence[float], S: int) -> list[int]:
    """Cut where the running time first passes each k/S share of the total."""
    n, total = len(times), sum(times)
    bounds, acc, s = [0], 0.0, 1
    for i, t in enumerate(times):
        if s < S and acc >= s * total / S and i > bounds[-1] and n - i >= S - s:
            bounds.append(i)
            s += 1
        acc += t
    while len(bounds) < S:  # too few cuts: take the last blocks one per stage
        bounds.append(n - (S - len(bounds)))
    return sorted(set(bounds)) if len(set(bounds)) == S else [round(k * n / S) for k in range(S)]
