"""Fast contiguous partitioning for large chains: :func:`solve_fast`.

Bisection on the bottleneck Z with a furthest-reach feasibility probe, the parametric search
for the linear-partition (bottleneck) problem (Manne & Olstad 1995; Pinar & Aykanat 2004),
extended with per-stage memory limits, recomputation and cut comm.

**Feasible pieces.** For a given Z, a range [i, j) may be stage s if its time is <= Z and its
memory fits (without recomputation, or, where the mode allows, with it and its time plus
recompute time <= Z); a cut at position j is allowed if comm(j) <= Z. For a *fixed start* i
each condition is closed under shrinking the end: time and static/activation sums only grow
with j, and so does in_bytes(i, j) (more consumers, same producers outside). So the ends that
stage s can reach from i form a prefix ``(i, E_s(i)]``, with ``E_s(i)`` the furthest end
(memory part precomputed per stage with ``searchsorted`` / a vectorised binary search, time
part per probe).

**Greedy probe.** Stage s starts where stage s-1 ended and goes to the furthest allowed cut
``j <= min(E_s(i), n - (S-1-s))`` (leaving a block for each later stage). Claim: if a
partition ``b`` is feasible and the greedy starts ``g`` never get stuck, then ``g_s >= b_s``.
Proof by induction: if ``g_s < b_{s+1}``, the range [g_s, b_{s+1}) lies inside b's stage s
[b_s, b_{s+1}), so it is feasible for stage s *when feasibility is also closed under raising
the start* (time and memory without recomputation are; in_bytes is not), and b_{s+1} is an
allowed cut, so ``g_{s+1} >= b_{s+1}``; if ``g_s >= b_{s+1}`` it holds trivially. The greedy
can still get stuck where b does not, once it has run ahead (``g_s >= b_{s+1}``): the block
at g_s may not fit stage s although it fits the later stage b gives it (per-stage limits and
in-flight counts differ), the next allowed cut after g_s may lie beyond the reach of stage s
(comm is not monotone in the position), or a start inside a recomputed range may need more
input bytes. Then the greedy answer is only an upper bound.

**Exact probe.** So every answer is certified by an exact reachability probe: with R_s the
set of positions where stage s can start, ``R_{s+1} = {j allowed : exists i in R_s,
i < j <= E_s(i)}`` (a difference array and a cumulative sum per stage, O(S n) per probe). It
is exact because the feasible ends from each start form a prefix (above). If greedy bisection
ends at Z_g and the exact probe rejects the next float below Z_g, Z* = Z_g exactly;
otherwise (rare) bisection repeats with the exact probe.

**Exact Z.** The bracket starts at max(longest block, total / S) less a rounding margin
(:func:`_lower`) and is split at its geometric mean while over 2x, then halved. Each successful
probe returns a partition whose largest piece M <= Z, and the upper bound moves to M, a value
some partition attains; once the bracket is below 1e-12 relative, the next probe is at the
float just below the upper bound. So the result's bottleneck *is* Z* (in this module's
arithmetic: range sums as prefix differences).

**In C.** ``_probe.c`` runs the greedy probe and its bisection where it is built; the Python
twin below (``AUTOPIPE_NO_SIMCORE=1``) gives the same partition to the last bit.

**Total is approximate.** Phase 2 (least total at Z*) is not solved here: the result is the
greedy (or exact-probe) partition at Z*, whose total may exceed the optimum. Use
:func:`~autopipe.partition.chain.solve_chain` when the total matters and n is moderate.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from autopipe import native
from autopipe.errors import InfeasibleError, PlanError
from autopipe.partition._intervals import Floats, InBytes, position_comm, prefix, stage_kinds
from autopipe.partition._intervals import stage_caps as caps
from autopipe.partition.min_memory import infeasible_error
from autopipe.partition.problem import Partition, PartitionProblem, contiguous_assignment, evaluate

__all__ = ["solve_fast"]

Ints = NDArray[np.int64]

BISECT_GAP = 1e-12  # below this gap (relative) the bisection probes the next float down; _probe.c mirrors it


_NATIVE = native.load(native.PROBE)  # None where not built: the Python probe below


@dataclass(frozen=True)
class Memo:
    """Per-kind memory reach (and in_bytes) of one set of blocks, kept across problems on the
    same blocks (the search's decisions at one micro-batch size): ``solve_fast(memo=)``."""

    plain: dict[tuple[float, float], Ints] = field(default_factory=dict)  # (in-flight, cap) -> furthest end
    rc: dict[tuple[float, float], Ints] = field(default_factory=dict)
    in_bytes: list[InBytes] = field(default_factory=list)  # at most one
    plain_l: dict[tuple[float, float], list[int]] = field(default_factory=dict)  # the rows above as lists
    rc_l: dict[tuple[float, float], list[int]] = field(default_factory=dict)
    sums: list[_Sums] = field(default_factory=list)  # at most one


@dataclass(frozen=True)
class _Sums:
    """Prefix sums of one set of blocks (and the comm of each cut), as arrays and as lists."""

    pt: Floats
    pr: Floats
    comm: Floats
    ps: Floats
    pa: Floats
    psa: Floats
    pt_l: list[float]
    pr_l: list[float]
    comm_l: list[float]
    ptr_l: list[float]
    link: tuple[float, float]  # the comm's latency and bandwidth

    @staticmethod
    def of(p: PartitionProblem) -> _Sums:
        pt, pr, comm = prefix(p.time_s), prefix(p.recompute_s), position_comm(p)[1]
        psa = prefix(tuple(a + b for a, b in zip(p.static_bytes, p.activation_bytes, strict=True)))
        return _Sums(
            pt,
            pr,
            comm,
            prefix(p.static_bytes),
            prefix(p.activation_bytes),
            psa,
            pt.tolist(),
            pr.tolist(),
            comm.tolist(),
            (pt + pr).tolist(),
            (p.link_latency_s, p.link_bandwidth),
        )


def _furthest(cost: Callable[[Ints, Ints], Floats], guess: Ints, bound: float | Floats) -> Ints:
    """For every start i: the largest e in [i, n] with cost(i, e) <= bound, where cost is
    non-decreasing in e and cost(i, i) == 0; ``guess`` is close (found by searchsorted)."""
    n = len(guess) - 1
    i = np.arange(n + 1)
    e = np.clip(guess, i, n)
    while True:
        bad = (e > i) & (cost(i, e) > bound)
        if not bad.any():
            break
        e = e - bad
    while True:
        nxt = np.minimum(e + 1, n)
        good = (e < n) & (cost(i, nxt) <= bound)
        if not good.any():
            return e
        e = e + good


@dataclass(frozen=True)
class _Found:
    starts: tuple[int, ...]
    recompute: tuple[bool, ...]
    worst: float  # largest piece (stage time or cut comm)


class _Probes:
    """Precomputed prefix sums and per-stage memory reach of one problem."""

    def __init__(self, p: PartitionProblem, memo: Memo | None = None) -> None:
        self.p, self.n, self.S = p, p.blocks, p.stages
        self.memo = memo = Memo() if memo is None else memo
        if not memo.sums or memo.sums[0].link != (p.link_latency_s, p.link_bandwidth):
            memo.sums[:] = [_Sums.of(p)]
        self.sums = sums = memo.sums[0]
        self.pt, self.pr, self.comm = sums.pt, sums.pr, sums.comm
        self.pt_l, self.pr_l, self.comm_l, self.ptr_l = sums.pt_l, sums.pr_l, sums.comm_l, sums.ptr_l
        self.plain_ok, self.rc_ok = p.recompute != "always", p.recompute != "never"
        if self.rc_ok and not memo.in_bytes:
            memo.in_bytes.append(InBytes(p))
        self.tabled = False  # the memory reach tables: built by the first Python probe (_tables)

    def _tables(self) -> None:
        """Each stage's memory reach from every start (with and without recomputation), as
        arrays and lists; per kind in the memo (computed once per blocks and kind)."""
        if self.tabled:
            return
        self.tabled = True
        p, n, memo, sums = self.p, self.n, self.memo, self.sums
        ps, pa, psa = sums.ps, sums.pa, sums.psa
        idx = np.arange(n + 1)
        kinds, of_stage = stage_kinds(p)  # stages alike reach alike: each kind computed once
        if _NATIVE is not None and native.enabled():  # the numbers of the searches below
            for (k, cap), rc in itertools.product(kinds, (False, True) if self.rc_ok else (False,)):
                table = memo.rc if rc else memo.plain
                if (k, cap) not in table:
                    table[k, cap] = out = np.empty(n + 1, dtype=np.int64)
                    _NATIVE.reach(ps, pa, psa, *self._in_bytes(), k, cap, rc, out)
        for k, cap in kinds:
            if (k, cap) not in memo.plain:
                pw = ps + k * pa
                guess = np.searchsorted(pw, pw + cap, side="right") - 1
                memo.plain[k, cap] = _furthest(lambda i, e: pw[e] - pw[i], guess, cap)  # noqa: B023 (called here)
        new = [(k, cap) for k, cap in kinds if (k, cap) not in memo.rc]
        if self.rc_ok and new:  # binary search on the end, vectorised over all (kind, start) pairs
            inb = memo.in_bytes[0]
            shape = (len(new), n + 1)
            start = np.broadcast_to(idx, shape).ravel()
            k_v = np.broadcast_to(np.asarray([k for k, _ in new], dtype=np.float64)[:, None], shape).ravel()
            cap_v = np.broadcast_to(np.asarray([c for _, c in new], dtype=np.float64)[:, None], shape).ravel()
            lo = start.copy()
            # static + activations alone must fit: an upper bound (+1 absorbs rounding)
            hi = np.clip(np.searchsorted(psa, psa[start] + cap_v, side="right"), lo, n)
            active = np.flatnonzero(lo < hi)
            while active.size:
                a_lo, a_hi, a_i = lo[active], hi[active], start[active]
                mid = (a_lo + a_hi + 1) // 2
                ok = (psa[mid] - psa[a_i]) + k_v[active] * inb.at(a_i, mid) <= cap_v[active]
                lo[active] = np.where(ok, mid, a_lo)
                hi[active] = np.where(ok, a_hi, mid - 1)
                active = active[lo[active] < hi[active]]
            for (k, cap), row in zip(new, lo.reshape(shape), strict=True):
                memo.rc[k, cap] = row
        plain_by_kind = [memo.plain[kind] for kind in kinds]
        rc_by_kind = [memo.rc[kind] if self.rc_ok else idx for kind in kinds]
        for kind in kinds:
            if kind not in memo.plain_l:
                memo.plain_l[kind] = memo.plain[kind].tolist()
            if self.rc_ok and kind not in memo.rc_l:
                memo.rc_l[kind] = memo.rc[kind].tolist()
        plain_l = [memo.plain_l[kind] for kind in kinds]
        rc_l = [memo.rc_l[kind] for kind in kinds] if self.rc_ok else [idx.tolist()] * len(kinds)
        self.mem_plain = [plain_by_kind[j] for j in of_stage]
        self.mem_rc = [rc_by_kind[j] for j in of_stage]
        self.mem_plain_l = [plain_l[j] for j in of_stage]
        self.mem_rc_l = [rc_l[j] for j in of_stage]

    def _in_bytes(self) -> tuple[Ints, Floats, Floats]:
        """The C probe's in_bytes: InBytes' arrays (empty where nothing is recomputed)."""
        inb, none = self.memo.in_bytes[0] if self.rc_ok else None, np.zeros(0)
        return (none.astype(np.int64), none, none) if inb is None else (inb.keys, inb.cum, inb.row_base)

    def native(self, lower: float, tolerance: float) -> _Found | None:
        """``greedy(inf)``, then ``_bisect(greedy, lower, that, tolerance)``, in C (_probe.c:
        the same partition, to the last bit); None where ``greedy(inf)`` gets stuck."""
        assert _NATIVE is not None
        p, s = self.p, self.sums
        starts, rc = np.zeros(self.S, dtype=np.int64), np.zeros(self.S, dtype=np.bool_)
        worst = _NATIVE.solve(
            s.pt,
            s.pr,
            s.comm,
            s.ps,
            s.pa,
            s.psa,
            *self._in_bytes(),
            np.asarray(p.inflight, dtype=np.float64),
            caps(p),
            self.plain_ok,
            self.rc_ok,
            lower,
            tolerance,
            starts,
            rc,
        )
        return None if worst is None else _Found(tuple(starts.tolist()), tuple(rc.tolist()), worst)

    # -- per-probe pieces -------------------------------------------------------------------
    def _time_reach(self, z: float) -> tuple[Ints, Ints]:
        pt, pr = self.pt, self.pr
        plain = rc = np.arange(self.n + 1)
        if self.plain_ok:
            plain = _furthest(lambda i, e: pt[e] - pt[i], np.searchsorted(pt, pt + z, side="right") - 1, z)
        if self.rc_ok:
            ptr = pt + pr
            rc = _furthest(
                lambda i, e: (pt[e] - pt[i]) + (pr[e] - pr[i]), np.searchsorted(ptr, ptr + z, side="right") - 1, z
            )
        return plain, rc

    def _found(self, starts: list[int]) -> _Found:
        self._tables()
        ends = [*starts[1:], self.n]
        worst, rcs = 0.0, []
        pt, pr = self.pt_l, self.pr_l
        for s, (i, j) in enumerate(zip(starts, ends, strict=True)):
            plain = self.plain_ok and j <= self.mem_plain_l[s][i]
            t = pt[j] - pt[i]
            if not plain:
                t = t + (pr[j] - pr[i])
            rcs.append(not plain)
            worst = max(worst, t, self.comm_l[j] if s < self.S - 1 else 0.0)
        return _Found(tuple(starts), tuple(rcs), worst)

    # -- probes -----------------------------------------------------------------------------
    def _plain_reach(self, i: int, z: float) -> int:
        """Scalar twin of ``_time_reach`` (same predicate, so the same answer)."""
        pt, n = self.pt_l, self.n
        e = max(i, bisect_right(pt, pt[i] + z, i) - 1)
        while e > i and pt[e] - pt[i] > z:
            e -= 1
        while e < n and pt[e + 1] - pt[i] <= z:
            e += 1
        return e

    def _rc_reach(self, i: int, z: float) -> int:
        pt, pr, ptr, n = self.pt_l, self.pr_l, self.ptr_l, self.n
        e = max(i, bisect_right(ptr, ptr[i] + z, i) - 1)
        while e > i and (pt[e] - pt[i]) + (pr[e] - pr[i]) > z:
            e -= 1
        while e < n and (pt[e + 1] - pt[i]) + (pr[e + 1] - pr[i]) <= z:
            e += 1
        return e

    def greedy(self, z: float) -> _Found | None:
        self._tables()
        n, S, comm = self.n, self.S, self.comm_l
        starts, i = [0], 0
        pt, pr = self.pt_l, self.pr_l
        for s in range(S):
            e, bound = i, True
            if self.plain_ok:  # min(memory reach, time reach), the time reach found only if below
                e = self.mem_plain_l[s][i]
                if pt[e] - pt[i] <= z:
                    bound = e < n and pt[e + 1] - pt[i] <= z  # memory binds
                else:
                    e, bound = self._plain_reach(i, z), False
            if self.rc_ok and bound:  # (else no recomputed stage reaches further)
                r = self.mem_rc_l[s][i]
                if not (pt[r] - pt[i]) + (pr[r] - pr[i]) <= z:
                    r = self._rc_reach(i, z)
                e = max(e, r)
            if s == S - 1:
                return self._found(starts) if e >= n else None
            j = min(e, n - (S - 1 - s))
            while j > i and comm[j] > z:  # the furthest allowed cut
                j -= 1
            if j <= i:
                return None
            starts.append(j)
            i = j
        raise AssertionError("unreachable")

    def exact(self, z: float) -> _Found | None:
        self._tables()
        n, S = self.n, self.S
        tp, tr = self._time_reach(z)
        allowed = self.comm <= z
        allowed[n] = True
        reach = np.zeros(n + 1, dtype=bool)
        reach[0] = True
        history: list[tuple[NDArray[np.bool_], Ints]] = []
        for s in range(S):
            e = np.arange(n + 1)
            if self.plain_ok:
                e = np.minimum(self.mem_plain[s], tp)
            if self.rc_ok:
                e = np.maximum(e, np.minimum(self.mem_rc[s], tr))
            history.append((reach, e))
            starts = np.flatnonzero(reach)
            cover = (
                np.cumsum(np.bincount(starts + 1, minlength=n + 2) - np.bincount(e[starts] + 1, minlength=n + 2))[
                    : n + 1
                ]
                > 0
            )
            reach = cover & allowed
        if not reach[n]:
            return None
        bounds, j = [0] * S, n
        for s in range(S - 1, -1, -1):
            r, e = history[s]
            cand = np.flatnonzero(r[:j] & (e[:j] >= j))
            j = bounds[s] = int(cand[-1])
        return self._found(bounds)


def _bisect(probe: Callable[[float], _Found | None], lo: float, best: _Found, tolerance: float = 0.0) -> _Found:
    """Smallest attained Z in (lo, best.worst] for which ``probe`` succeeds (within
    ``tolerance``, relative, when it is positive)."""
    hi = best.worst
    while hi - lo > tolerance * hi:  # halving the ratio first while it is over 2, then the gap
        mid = (
            lo * math.sqrt(hi / lo)
            if hi > 2 * lo > 0
            else lo + (hi - lo) / 2
            if hi - lo > BISECT_GAP * hi
            else math.nextafter(hi, -math.inf)
        )
        if not lo < mid < hi:
            return best
        found = probe(mid)
        if found is None:
            lo = mid
        else:
            best, hi = found, found.worst
    return best


def _lower(p: PartitionProblem, total: float) -> float:
    """Below Z*: a stage holds the longest block, one at least 1/S of the total; less the
    rounding of prefix differences (under 2 ulps of the total each, total <= S * bound)."""
    return max(max(p.time_s), total / p.stages) * (1 - 1e-14 * (p.stages + 1))


def solve_fast(
    problem: PartitionProblem, *, explain: bool = True, tolerance: float = 0.0, memo: Memo | None = None
) -> Partition:
    """A contiguous partition with the least bottleneck Z (exact); its total is not minimised.

    ``tolerance`` > 0: a bottleneck within that (relative) of the least, found with fewer
    probes (about log2(1 / tolerance) instead of 40) and not certified by the exact probe
    where the greedy one succeeds (the search's candidates, which the simulator prices anyway).
    ``memo``: a dict kept across problems with the same blocks, tensors and costs (only the
    stage count, in-flight counts and limits differing), so each (in-flight, limit) kind's
    memory reach is computed once.
    Raises :class:`~autopipe.errors.InfeasibleError` when no contiguous partition fits
    memory (with the smallest limit that would, unless ``explain=False``).
    """
    p = problem
    if p.recompute_layers:
        raise PlanError("the bisection solver does not price the block method (recompute_layers); use solve_chain")
    probes = _Probes(p, memo)
    lower = _lower(p, float(probes.pt[-1]))
    if _NATIVE is not None and native.enabled():
        found = probes.native(lower, tolerance)
    else:
        start = probes.greedy(math.inf)
        found = None if start is None else _bisect(probes.greedy, lower, start, tolerance)
    if found is not None:
        best = found
        below = math.nextafter(best.worst, -math.inf)
        if below >= 0 and tolerance <= 0:
            witness = probes.exact(below)  # certify: nothing strictly better exists
            if witness is not None:
                best = _bisect(probes.exact, lower, witness)
    else:
        witness = probes.exact(math.inf)
        if witness is None:
            raise infeasible_error(p) if explain else InfeasibleError("no partition fits")
        best = _bisect(probes.exact, lower, witness, tolerance)
    return evaluate(p, contiguous_assignment(best.starts, p.blocks), best.recompute)
