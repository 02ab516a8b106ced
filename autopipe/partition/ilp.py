"""Exact mixed-integer program over monotone assignments of a DAG: :func:`solve_ilp`.

The assignment MILP of the pipeline planners that cut DAGs rather than chains (e.g. Tarnawski
et al., "Efficient algorithms for device placement of DNN graph operators", NeurIPS 2020;
Alpa's inter-operator pass, Zheng et al. 2022), with this package's cost model. All variables
are per micro-batch; times are divided by a time unit and each memory row by its limit so
that the solver's tolerances are relative.

- ``x[i,s]`` binary, one stage per block, every stage non-empty; ``Y[i,c] = sum_{s<=c} x[i,s]``
  (block i sits at or before stage c). Monotone: ``Y[d,c] <= Y[src,c]`` for every tensor.
- ``a[t,c] >= Y[src,c] - Y[d,c]`` (tensor t alive across cut c), ``cut_bytes(c) = sum b_t
  a[t,c]``; ``l_c >= a[t,c]`` binary switches the latency on; ``Z >= comm_c``.
- ``rho_s`` recompute (binary in "auto", fixed otherwise), ``w[i,s] = x[i,s] rho_s``
  (exact product linearisation); ``T_s = sum t_i x[i,s] + sum r_i w[i,s]``; ``Z >= T_s``.
- in_bytes: ``u[t,s] >= x[d,s] - x[src,s]`` (consumed in s, produced outside), ``v[t,s] >=
  u[t,s] + rho_s - 1``; memory ``sum static x + sum act (k x - (k-1) w) + k sum b v <= limit``.

Lexicographic objective by two solves: min Z; then min total subject to
``Z <= Z*(1 + 1e-7) + 1e-12`` (Z* as priced by :func:`evaluate`). The result is the second
solution priced by :func:`evaluate` with the per-stage recompute rule, which also removes
recomputation the solver left on for free. CBC runs single-threaded, so it is deterministic
(up to the time limit).

Tests: tests/partition/test_solvers.py.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

from autopipe.errors import PlanError
from autopipe.partition.min_memory import infeasible_error
from autopipe.partition.problem import (
    Edge,
    Partition,
    PartitionProblem,
    evaluate,
    memory_cap,
    stage_stats,
)

if TYPE_CHECKING:
    import pulp  # imported where a model is built: planning a chain never loads it

__all__ = ["SolverUnavailable", "solve_ilp"]

Expr: TypeAlias = Any  # pulp.LpAffineExpression (pulp is untyped)


@contextmanager
def _quiet() -> Iterator[None]:
    """PuLP 3.x warns that ``LpVariable(...)`` and ``PULP_CBC_CMD`` change in PuLP 4; both are
    the API that works from PuLP 2.7 on, and the bundled CBC is the solver every install has."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        yield


class SolverUnavailable(PlanError):
    """The ILP solver (CBC, a subprocess) could not be started: it failed to fork, or its
    binary is missing. Nothing is wrong with the problem; the search keeps the plan it has."""


class _Model:
    """The MILP of one problem; ``memory_var`` replaces the limits by one variable limit L."""

    def __init__(self, p: PartitionProblem, memory_var: bool = False) -> None:
        import pulp

        self.p = p
        self.prob = pulp.LpProblem("autopipe_partition", pulp.LpMinimize)
        crossing = [t for t in p.tensors if t.src >= 0 and t.dsts and t.bytes > 0]
        self.tau = max(
            sum(p.time_s) + sum(p.recompute_s),
            p.link_latency_s + sum(t.bytes for t in crossing) / p.link_bandwidth,
            1e-12,
        )
        self.x, Y = self._assignment()
        self.Z = pulp.LpVariable("Z", lowBound=0)
        rho, w = self._recompute()
        stage_time = self._stage_times(w)
        comm = self._cuts(crossing, Y)
        self.total = pulp.lpSum(stage_time) + pulp.lpSum(comm)
        self.L = pulp.LpVariable("L", lowBound=0) if memory_var else None
        self._memory(rho, w)

    def _assignment(self) -> tuple[list[list[Any]], list[list[Expr]]]:
        """``x[i][s]`` (one stage per block, no stage empty) and ``Y[i][c]``, monotone along every tensor."""
        import pulp

        p, prob = self.p, self.prob
        n, S = p.blocks, p.stages
        x = [[pulp.LpVariable(f"x_{i}_{s}", cat="Binary") for s in range(S)] for i in range(n)]
        Y = [[pulp.lpSum(x[i][: c + 1]) for c in range(S)] for i in range(n)]
        for i in range(n):
            prob += pulp.lpSum(x[i]) == 1
        for s in range(S):
            prob += pulp.lpSum(x[i][s] for i in range(n)) >= 1
        edges = sorted({(t.src, d) for t in p.tensors if t.src >= 0 for d in t.dsts})
        for src, d in edges:
            for c in range(S - 1):
                prob += Y[d][c] <= Y[src][c]
        return x, Y

    def _recompute(self) -> tuple[list[Any], list[list[Any]]]:
        """``rho[s]`` (binary in "auto", fixed otherwise) and ``w[i][s] = x[i][s] rho[s]``."""
        import pulp

        p, prob, x = self.p, self.prob, self.x
        S = p.stages
        if p.recompute == "auto":
            rho: list[pulp.LpVariable | float] = [pulp.LpVariable(f"rho_{s}", cat="Binary") for s in range(S)]
        else:
            rho = [1.0 if p.recompute == "always" else 0.0] * S
        w: list[list[Expr | pulp.LpVariable | float]] = []
        for i in range(p.blocks):
            row: list[Expr | pulp.LpVariable | float] = []
            for s in range(S):
                r = rho[s]
                if isinstance(r, float):
                    row.append(x[i][s] * r)
                else:
                    v = pulp.LpVariable(f"w_{i}_{s}", lowBound=0)
                    prob += v <= x[i][s]
                    prob += v <= r
                    prob += v >= x[i][s] + r - 1
                    row.append(v)
            w.append(row)
        return rho, w

    def _stage_times(self, w: list[list[Any]]) -> list[Expr]:
        """``T_s`` in time units, each below Z."""
        import pulp

        p, x = self.p, self.x
        stage_time = [
            pulp.lpSum(
                p.time_s[i] / self.tau * x[i][s] + p.recompute_s[i] / self.tau * w[i][s] for i in range(p.blocks)
            )
            for s in range(p.stages)
        ]
        for s in range(p.stages):
            self.prob += self.Z >= stage_time[s]
        return stage_time

    def _cuts(self, crossing: list[Edge], Y: list[list[Expr]]) -> list[Expr]:
        """``comm_c`` of every cut (tensors alive across it, the latency switched on), each below Z."""
        import pulp

        p, prob = self.p, self.prob
        comm: list[Expr] = []
        for c in range(p.stages - 1):
            alive = []
            for k, t in enumerate(crossing):
                a = pulp.LpVariable(f"a_{k}_{c}", lowBound=0, upBound=1)
                for d in set(t.dsts):
                    prob += a >= Y[t.src][c] - Y[d][c]
                alive.append((t.bytes, a))
            expr = pulp.lpSum(b / p.link_bandwidth / self.tau * a for b, a in alive)
            if p.link_latency_s > 0 and alive:
                on = pulp.LpVariable(f"l_{c}", cat="Binary")
                for _, a in alive:
                    prob += on >= a
                expr = expr + p.link_latency_s / self.tau * on
            comm.append(expr)
            prob += self.Z >= expr
        return comm

    def _memory(self, rho: list[Any], w: list[list[Any]]) -> None:
        """Every stage's memory row: within its limit (:func:`memory_cap`), or below L."""
        import pulp

        p, prob, x = self.p, self.prob, self.x
        n = p.blocks
        self.mem_unit = max(
            1.0, max(p.static_bytes) + max(p.inflight) * (sum(p.activation_bytes) + sum(t.bytes for t in p.tensors))
        )
        inputs = [t for t in p.tensors if t.dsts and t.bytes > 0]
        for s in range(p.stages):
            limit = p.stage_memory_limit[s]
            if self.L is None and math.isinf(limit):
                continue
            scale = self.mem_unit if self.L is not None else max(limit, 1.0)
            k_s = p.inflight[s]
            terms: list[Expr] = [
                (p.static_bytes[i] / scale) * x[i][s]
                + (p.activation_bytes[i] / scale) * (k_s * x[i][s] - (k_s - 1) * w[i][s])
                for i in range(n)
            ]
            if p.recompute != "never" and k_s > 0:
                for q, t in enumerate(inputs):
                    u = pulp.LpVariable(f"u_{q}_{s}", lowBound=0, upBound=1)
                    for d in set(t.dsts):
                        prob += u >= (x[d][s] - x[t.src][s] if t.src >= 0 else x[d][s])
                    v = pulp.LpVariable(f"v_{q}_{s}", lowBound=0)
                    prob += v >= u + rho[s] - 1
                    terms.append((k_s * t.bytes / scale) * v)
            if self.L is not None:
                prob += pulp.lpSum(terms) <= self.L
            else:
                prob += pulp.lpSum(terms) <= memory_cap(limit) / scale

    def solve(self, objective: Expr | pulp.LpVariable, time_limit_s: float) -> bool:
        """Solve; True if a solution was found, False if the model is infeasible."""
        import pulp

        self.prob.setObjective(objective)
        solver = pulp.PULP_CBC_CMD(msg=False, threads=1, timeLimit=time_limit_s)
        try:
            self.prob.solve(solver)
        except (OSError, pulp.PulpSolverError) as e:  # fork failed (Errno 11), binary missing
            raise SolverUnavailable(
                f"the ILP solver (CBC) could not start ({e}); free a process slot or reinstall pulp, or use solve_chain"
            ) from e
        status = pulp.LpStatus[self.prob.status]
        if status == "Infeasible":
            return False
        if status != "Optimal" or self.x[0][0].value() is None:
            raise PlanError(
                f"the ILP solver found no partition within {time_limit_s} s "
                f"(status {status}); raise time_limit_s or use solve_chain"
            )
        return True

    def assignment(self) -> tuple[int, ...]:
        return tuple(max(range(self.p.stages), key=lambda s: row[s].value() or 0.0) for row in self.x)


def _min_memory(p: PartitionProblem, time_limit_s: float) -> float:
    """Smallest single per-device limit under which some monotone assignment fits."""
    with _quiet():
        return _min_memory_quiet(p, time_limit_s)


def _min_memory_quiet(p: PartitionProblem, time_limit_s: float) -> float:
    m = _Model(p, memory_var=True)
    if m.L is None or not m.solve(m.L, time_limit_s):  # cannot happen: L is free
        return math.inf
    st = stage_stats(p, m.assignment())
    modes = {"never": (False,), "always": (True,), "auto": (False, True)}[p.recompute]
    return max(min(st.memory(p, s, r) for r in modes) for s in range(p.stages))


def solve_ilp(problem: PartitionProblem, time_limit_s: float = 60.0) -> Partition:
    """The lexicographically best monotone assignment (Z, then total), by two MILP solves.

    ``time_limit_s`` bounds each solve; a solve that finds nothing in time raises
    :class:`PlanError`. Raises :class:`~autopipe.errors.InfeasibleError` (with the smallest
    limit under which some monotone assignment fits) when nothing fits.
    """
    if problem.recompute_layers:
        raise PlanError("the ILP does not price the block method (recompute_layers); use solve_chain")
    with _quiet():
        return _solve_ilp(problem, time_limit_s)


def _solve_ilp(p: PartitionProblem, time_limit_s: float) -> Partition:
    model = _Model(p)
    if not model.solve(model.Z, time_limit_s):
        raise infeasible_error(p, _min_memory(p, time_limit_s))
    first = evaluate(p, model.assignment())
    bound = first.bottleneck_s * (1 + 1e-7) + 1e-12
    model.prob += model.Z <= bound / model.tau
    if not model.solve(model.total, time_limit_s):  # cannot happen: the first is a solution
        return first
    second = evaluate(p, model.assignment())
    return second if second.fits and second.total_s <= first.total_s else first
