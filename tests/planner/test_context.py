"""The search's context (autopipe/planner/context.py): one per search, one size context per u."""

from __future__ import annotations

from autopipe.planner.context import SearchContext
from autopipe.planner.pricing import BlockTimes, Decision
from autopipe.planner.request import PlanRequest
from autopipe.planner.search import plan_pipeline
from tests.planner.test_exact import NO_LIMIT, chain


def test_decisions_at_one_micro_batch_size_share_its_context() -> None:
    prof = chain(12, seed=3)
    ctx = SearchContext(prof, PlanRequest(devices=4, batch_size=16, memory_limit=NO_LIMIT))
    a = ctx.size(Decision("1f1b", 1, 4))
    assert ctx.size(Decision("zb-h1", 1, 4)) is a and a.u == 4  # same m, same u: the same numbers
    b = ctx.size(Decision("1f1b", 1, 8))
    assert b is not a and b.u == 2
    assert a.times == BlockTimes.of(prof, 4, 0.0, ctx.schedules)  # what it holds is what it says


def test_a_plan_does_not_depend_on_an_earlier_search() -> None:
    prof = chain(12, seed=5)
    req = PlanRequest(devices=4, batch_size=16, memory_limit=NO_LIMIT)
    first = plan_pipeline(prof, req).to_json()
    plan_pipeline(chain(10, seed=6), PlanRequest(devices=2, batch_size=8, memory_limit=NO_LIMIT))
    assert plan_pipeline(prof, req).to_json() == first
