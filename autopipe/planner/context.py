"""What one search reuses, made by the search and passed down: nothing is kept at module level.

A :class:`SearchContext` holds one :class:`SizeContext` per micro-batch size ``u = B / m``
(the block times, the partition numbers and what the kernels keep of them: every decision at
that size shares them) and the compiled schedules the search prices on
(:class:`~autopipe.planner.pricing.Schedules`). A search starts with an empty one, so a plan
never depends on what an earlier search kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autopipe.costs.profile import Profile
from autopipe.partition.greedy import Memo
from autopipe.planner.pricing import BlockTimes, Decision, Schedules, micro_batch_size
from autopipe.planner.request import PlanRequest
from autopipe.planner.splits import BlockNumbers

__all__ = ["SearchContext", "SizeContext"]


@dataclass(frozen=True)
class SizeContext:
    """One micro-batch size's numbers, computed once: its block times (and the bounds' sums of
    them), the partition problems' per-block numbers (and the kernels' memo of them), and the
    bisection solver's memory reach across the decisions at this size."""

    u: int  # the micro-batch size, B / m
    times: BlockTimes
    numbers: BlockNumbers
    reach: Memo = field(default_factory=Memo, compare=False, repr=False)


class SearchContext:
    """The contexts of one search's micro-batch sizes and its compiled schedules."""

    def __init__(self, profile: Profile, request: PlanRequest) -> None:
        self.profile, self.request = profile, request
        self.schedules = Schedules()
        self._sizes: dict[int, SizeContext] = {}

    def sharing(self, profile: Profile, request: PlanRequest) -> SearchContext:
        """A context for another search of the same planning (a memory choice's, planner/search.py):
        the compiled schedules shared, and the sizes' numbers too where the profile is this one's
        (the request's batch, costs per action and state factor must be this one's)."""
        other = SearchContext(profile, request)
        other.schedules = self.schedules
        if profile is self.profile:
            other._sizes = self._sizes
        return other

    def size(self, decision: Decision) -> SizeContext:
        """The context of ``decision``'s micro-batch size (made on first use)."""
        req = self.request
        u = micro_batch_size(req.batch_size, decision)
        hit = self._sizes.get(u)
        if hit is None:
            times = BlockTimes.of(
                self.profile, u, req.action_overhead_s, self.schedules, req.blocking_sends, req.send_overhead_s
            )
            hit = self._sizes[u] = SizeContext(u, times, BlockNumbers.of(self.profile, u, req.state_factor))
        return hit
