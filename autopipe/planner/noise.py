"""Plans that hold on a noisy machine: the search's candidates ranked within the profile's spread.

A measured profile records how far each block's median time may be off (``BlockCost.spread``:
the timing rounds' interquartile range over the square root of their count, over the median --
about the median's standard error, :func:`autopipe.costs.measure.timing.relative_spread` -- per F, B,
B input-gradient and W). A candidate's
*worst case* is the simulator's iteration time with every block at its median plus that spread
(conservative: every block slow at once; the executor's cost per action and the links as they
are). Candidates whose predicted times overlap within the noise -- a median no later than the
fastest candidate's worst case -- are *tied*, and :func:`robust_order` chooses among them
deterministically:

1. the better worst case (worst cases closer than the fastest one's spread are equal);
2. then the decision in a fixed order: fewer micro-batches, the preferred schedule, fewer
   virtual stages;
3. then the lower peak memory (exact: it does not depend on the times), then earlier cuts
   (fewer blocks on the first stages), the solver's cuts before the simple splits.

(The decision before memory: the leanest tied candidates are often the slowest of the tie,
at its edge, in and out of it with the noise -- a plan that flips between rounds.)

So two plannings on one machine give the same plan unless the measurements really differ. The
plan records its uncertainty (worst case over median, less 1) and, where there was a tie, a
note naming the tied candidates; :func:`tie_warning` is the line the planner logs then.
Profiles without spreads (analytic ones, profiles written before) leave the search's order as
it is. Tests: tests/planner/test_noise.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from autopipe.costs.profile import Profile
from autopipe.partition.memo import Recent
from autopipe.planner.assemble import make_plan
from autopipe.planner.moves import sizes_of
from autopipe.planner.pricing import BlockTimes, Candidate, Priced, candidate, price
from autopipe.planner.request import PlanRequest
from autopipe.plans import Plan
from autopipe.schedules import schedule_spec

__all__ = [
    "MAX_MARGIN",
    "MAX_TIED",
    "Ranked",
    "describe",
    "robust_order",
    "robust_plan",
    "search_margin",
    "tie_warning",
    "worst_times",
]

log = logging.getLogger("autopipe")

MAX_TIED = 1000
"""At most this many of the fastest candidates are priced at their worst case."""


@dataclass(frozen=True)
class Ranked:
    """The candidates reordered (the chosen first), the chosen one's uncertainty and the tie."""

    fitting: list[Priced]
    uncertainty: float  # the chosen candidate's worst case over its prediction, less 1 (0: no spread)
    tied: tuple[str, ...]  # the tied candidates, in words, the chosen first; () without a tie
    spread: float  # the fastest candidate's relative spread (its worst case over its median, less 1)

    @property
    def note(self) -> str:
        """The plan's note on the tie ("" where there was none)."""
        if len(self.tied) < 2:
            return ""
        return (
            f"within the measured noise (±{self.spread:.0%}), {len(self.tied)} candidates: {_listed(self.tied)}; "
            f"chose {self.tied[0]} (better worst case, then fewer micro-batches, the preferred schedule, "
            "lower peak memory, earlier cuts)"
        )


MAX_MARGIN = 0.5
"""The search keeps going past the fastest plan by at most this much (relative) for the tie."""


def search_margin(profile: Profile) -> float:
    """How far (relative) past its fastest plan the search keeps simulating candidates, so the
    tied ones are among those it priced: the blocks' spreads weighted by their time (F + B at
    the largest micro-batch size measured), at most :data:`MAX_MARGIN`; 0 without spreads."""
    if profile.spread <= 0:
        return 0.0
    u = max(profile.micro_batch_sizes)
    weights = [b.forward_s(u) + b.backward_s(u) for b in profile.blocks]
    total = sum(weights)
    if total <= 0:
        return 0.0
    mean = sum(w * max(b.spread.forward, b.spread.backward) for w, b in zip(weights, profile.blocks, strict=True))
    return min(MAX_MARGIN, mean / total)


def worst_times(profile: Profile, times: BlockTimes) -> BlockTimes:
    """``times`` with every block at its median plus its measured spread (a fresh cost cache,
    the same compiled schedules)."""
    s = [b.spread for b in profile.blocks]
    return replace(
        times,
        f=tuple(t * (1 + x.forward) for t, x in zip(times.f, s, strict=True)),
        b=tuple(t * (1 + x.backward) for t, x in zip(times.b, s, strict=True)),
        bi=tuple(t * (1 + x.backward_input) for t, x in zip(times.bi, s, strict=True)),
        w=tuple(t * (1 + x.backward_weight) for t, x in zip(times.w, s, strict=True)),
        costs=Recent(8),
    )


def robust_order(profile: Profile, req: PlanRequest, fitting: list[Priced]) -> Ranked:
    """``fitting`` (every candidate that fits, fastest first) with the choice among the tied
    candidates first (the module docstring's rule), and what the plan records of it."""
    if profile.spread <= 0 or not fitting:
        return Ranked(fitting, 0.0, (), 0.0)
    worst_of: dict[int, BlockTimes] = {}  # per BlockTimes object (one per micro-batch size)

    def worst(c: Candidate) -> float:
        key = id(c.times)
        if key not in worst_of:
            worst_of[key] = worst_times(profile, c.times)
        return price(candidate(c.decision, c.source, c.problem, c.partition, worst_of[key]), req.devices).iteration_s

    best_t = fitting[0].summary.iteration_s
    best_worst = worst(fitting[0].candidate)
    spread = best_worst / best_t - 1 if best_t > 0 else 0.0
    tied: list[tuple[Priced, float]] = []
    seen: set[tuple[object, ...]] = set()
    for x in fitting[:MAX_TIED]:
        if x.summary.iteration_s > best_worst:
            break
        key = _identity(x.candidate)
        if key in seen:
            continue
        seen.add(key)
        tied.append((x, worst(x.candidate)))
    least = min(w for _, w in tied)
    margin = best_worst - best_t
    close = [(x, w) for x, w in tied if w <= least + margin]
    chosen, chosen_worst = min(close, key=lambda xw: _key(xw[0]))
    t = chosen.summary.iteration_s
    uncertainty = max(0.0, chosen_worst / t - 1) if t > 0 else 0.0
    rest = [x for x in fitting if x is not chosen]
    others = sorted((x for x, _ in tied if x is not chosen), key=_key)  # the note lists them in the rule's order
    words = tuple(describe(x.candidate) for x in [chosen, *others])
    return Ranked([chosen, *rest], uncertainty, words if len(tied) > 1 else (), spread)


def robust_plan(profile: Profile, req: PlanRequest, fitting: list[Priced]) -> Plan:
    """The Plan of the candidate :func:`robust_order` chooses, with its uncertainty and note
    (and the warning line logged where the spread leaves candidates tied)."""
    ranked = robust_order(profile, req, fitting)
    if ranked.tied:
        log.warning("%s", tie_warning(ranked))
    best, timeline = ranked.fitting[0]
    plan = make_plan(profile, req, best, timeline, ranked.fitting)
    return replace(plan, uncertainty=round(ranked.uncertainty, 6), noise_note=ranked.note)


def tie_warning(ranked: Ranked) -> str:
    """The line the planner logs where the spread is too wide to rank the close candidates."""
    return (
        f"the measured spread (±{ranked.spread:.0%}) is too wide to rank {_listed(ranked.tied)}; "
        f"the plan takes {ranked.tied[0]}: profile with a larger --repeat or on a quieter machine to separate them"
    )


def describe(c: Candidate) -> str:
    """A candidate in words: ``1f1b m=4 split 3/3`` (``/v2``, ``recompute 0,1`` where so)."""
    d = c.decision
    sizes = "/".join(str(n) for n in sizes_of(c.partition, c.problem.stages))
    recomputed = [str(s) for s, r in enumerate(c.partition.recompute) if r]
    return (
        f"{d.schedule}{f'/v{d.virtual}' if d.virtual > 1 else ''} m={d.micro_batches} split {sizes}"
        + (f" recompute {','.join(recomputed)}" if recomputed else "")
        + ("" if d.memory.none else f" ({d.memory.said})")
    )


def _listed(words: tuple[str, ...], most: int = 12) -> str:
    shown = list(words[:most]) + ([f"{len(words) - most} more"] if len(words) > most else [])
    return ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0]


def _identity(c: Candidate) -> tuple[object, ...]:
    d = c.decision
    return (d.schedule, d.virtual, d.micro_batches, d.memory, c.partition.stage_of_block, c.partition.recompute)


def _key(x: Priced) -> tuple[object, ...]:
    """The order among equal worst cases: fewer micro-batches, the preferred schedule, fewer
    chunks (the decision), then the lower peak memory, earlier cuts, no recomputation first, the
    solver's cuts first."""
    c = x.candidate
    d = c.decision
    return (
        d.micro_batches,
        schedule_spec(d.schedule).preference,
        d.virtual,
        max(x.summary.peak_memory_bytes),
        sizes_of(c.partition, c.problem.stages),
        c.partition.recompute,
        d.memory.key,
        c.source != "solver",
        c.source,
    )
