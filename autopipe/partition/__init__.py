"""Partition solvers: numbers in, stage assignment out (no torch).

- :func:`solve_chain`: exact DP over contiguous partitions (chains, or DAGs cut in order).
- :func:`solve_fast`: bisection + greedy for large chains; exact bottleneck, approximate total.
- :func:`solve_ilp`: exact MILP over monotone assignments of a DAG (pulp / CBC).
- :func:`solve_brute`: exhaustive search, the test oracle.
- ``reach.cannot_fit``: a one-pass proof that no contiguous partition fits memory (the
  planner's shortcut before a solver would prove it).
- :func:`evaluate`: prices any assignment; the definitions live in :mod:`.problem`, with the
  one "fits in memory" rule (:func:`memory_fits`, :func:`memory_cap`; tolerances :data:`EPS`,
  :data:`SCREEN_SLACK`).
- :class:`BlockMemo`: what the kernels may keep of one set of blocks across problems, given by
  the caller (``PartitionProblem(memo=...)``); nothing is kept at module level.
"""

from autopipe.partition.brute import solve_brute
from autopipe.partition.chain import solve_chain
from autopipe.partition.greedy import solve_fast
from autopipe.partition.ilp import solve_ilp
from autopipe.partition.memo import BlockMemo
from autopipe.partition.min_memory import min_memory_limit
from autopipe.partition.problem import (
    EPS,
    SCREEN_SLACK,
    Edge,
    Partition,
    PartitionProblem,
    evaluate,
    memory_cap,
    memory_fits,
)
from autopipe.units import format_bytes

__all__ = [
    "EPS",
    "SCREEN_SLACK",
    "BlockMemo",
    "Edge",
    "Partition",
    "PartitionProblem",
    "evaluate",
    "format_bytes",
    "memory_cap",
    "memory_fits",
    "min_memory_limit",
    "solve_brute",
    "solve_chain",
    "solve_fast",
    "solve_ilp",
]
