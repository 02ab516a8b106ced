"""The run report's split of the iteration into compute, messages and idle (the arithmetic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopipe.costs.profile import Profile
from autopipe.modes import Recompute
from autopipe.planner.search import PlanRequest, plan_pipeline
from autopipe.runtime.run.breakdown import Breakdown, Span, TimedAction, explain, predicted_split, split
from autopipe.runtime.run.report import format_breakdown
from autopipe.schedules import Action
from autopipe.simulate import sends_of

FIXTURES = Path(__file__).resolve().parents[3] / "bench" / "fixtures"


def _a(text: str) -> Action:
    a = Action.parse(text)
    assert a is not None
    return a


def test_split_waiting_at_the_producers_end() -> None:
    # rank 0: F of stage 0 [0, 1], then B of stage 0 begins at 1, its gradient arrives at 4.2;
    # rank 1: F of stage 1 begins at 0, its input (sent at 1) arrives at 1.5; B of stage 1 [2.5, 4].
    acts = [
        TimedAction(_a("0F0"), 0, 0.0, 0.0, 1.0),
        TimedAction(_a("0B0"), 0, 1.0, 4.2, 5.0),
        TimedAction(_a("1F0"), 1, 0.0, 1.5, 2.5),
        TimedAction(_a("1B0"), 1, 2.6, 2.6, 4.0),
    ]
    spans = split(acts, 2, {0: 0.0, 1: 0.0})
    assert spans[1].idle_s == pytest.approx(1.0)  # the peer computed until 1
    assert spans[1].messages_s == pytest.approx(0.5)  # sent at 1, arrived at 1.5
    assert spans[1].compute_s == pytest.approx(2.5)  # 1 + 1.4 of work, 0.1 between the actions
    assert spans[0].idle_s == pytest.approx(3.0)  # 1B0 ended at 4
    assert spans[0].messages_s == pytest.approx(0.2)
    assert spans[0].total_s == pytest.approx(5.0)


def test_split_on_a_later_origin_and_a_producer_past_ready() -> None:
    # the rank's clock starts at 10; the producer "ended" after the consumer was ready (clocks
    # of two hosts): the whole wait is idle, none of it messages
    acts = [TimedAction(_a("0F0"), 0, 10.0, 10.0, 13.0), TimedAction(_a("1F0"), 1, 10.0, 12.0, 12.5)]
    spans = split(acts, 2, {0: 10.0, 1: 10.0})
    assert spans[1] == Span(pytest.approx(0.5), 0.0, pytest.approx(2.0))  # type: ignore[arg-type]


def test_difference_sums_to_the_iteration() -> None:
    b = Breakdown(Span(1.0, 0.25, 0.5), Span(1.5, 0.5, 0.25))
    d = b.difference()
    assert (d.compute_s, d.messages_s, d.idle_s) == (0.5, 0.25, -0.25)
    assert d.total_s == pytest.approx(b.measured.total_s - b.predicted.total_s)
    lines = format_breakdown(b)
    assert lines[1].split()[-1] == "+28.6%" and lines[4].split()[-1] == "+28.6%"  # +0.5 s of 1.75 s
    assert lines[3].split()[-1] == "-14.3%"  # the parts sum to the iteration's error
    assert lines[5].startswith("mostly compute")
    assert "+250.000 ms" in lines[2]


def test_explain_names_the_largest_part() -> None:
    assert explain(Breakdown(Span(1.0, 0.25, 0.5), Span(1.5, 0.5, 0.25))).startswith("mostly compute: ")
    assert "computed 1.50x" in explain(Breakdown(Span(1.0, 0.25, 0.5), Span(1.5, 0.5, 0.25)))
    assert explain(Breakdown(Span(1.0, 0.1, 0.5), Span(1.0, 0.6, 0.5))).startswith("mostly messages: 600.000 ms")
    assert explain(Breakdown(Span(1.0, 0.1, 0.5), Span(1.1, 0.1, 0.9))).startswith("mostly idle")
    assert explain(Breakdown(Span(1.0, 0.1, 0.5), Span(0.6, 0.1, 0.5))).startswith("mostly compute")  # faster
    assert explain(Breakdown(Span(1.0, 0.1, 0.5), Span(1.1, 0.1, 0.5))) == ""  # within 10%


@pytest.mark.parametrize("schedule,virtual", [("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2)])
def test_predicted_split_is_the_plans_iteration(schedule: str, virtual: int) -> None:
    prof = Profile.load(FIXTURES / "gpt_profile.json")
    req = PlanRequest(
        devices=2,
        batch_size=16,
        memory_limit=2.0**34,
        micro_batches=8,
        schedule=schedule,
        virtual=virtual if virtual > 1 else None,
        recompute=Recompute.NEVER,
        link_bandwidth=1e8,
        link_latency_s=2e-3,
        action_overhead_s=3e-4,
    )
    plan = plan_pipeline(prof, req)
    span = predicted_split(plan)
    assert span.total_s == pytest.approx(plan.iteration_time_s)
    assert span.messages_s > 0 and span.compute_s > 0
    busy = sum(s.forward_s + s.backward_s for s in plan.stages) * plan.micro_batches / 2
    assert span.compute_s <= busy * 1.5  # one rank's work, not the whole pipeline's


def test_a_send_counts_with_the_messages() -> None:
    # rank 0: F of stage 0 [0, 1.5], 0.5 of it handing its output to rank 1; B of stage 0 [4, 5]
    acts = [
        TimedAction(_a("0F0"), 0, 0.0, 0.0, 1.5, 0.5),
        TimedAction(_a("0B0"), 0, 1.5, 4.0, 5.0),
        TimedAction(_a("1F0"), 1, 0.0, 1.5, 2.5),
        TimedAction(_a("1B0"), 1, 2.5, 2.5, 4.0, 0.5),
    ]
    spans = split(acts, 2, {0: 0.0, 1: 0.0})
    assert spans[0] == Span(pytest.approx(2.0), pytest.approx(0.5), pytest.approx(2.5))  # type: ignore[arg-type]
    assert spans[1] == Span(pytest.approx(2.0), pytest.approx(0.5), pytest.approx(1.5))  # type: ignore[arg-type]


@pytest.mark.parametrize("schedule,virtual", [("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2)])
def test_the_plans_sends_are_predicted_as_messages(schedule: str, virtual: int) -> None:
    """With a free link, the predicted messages are the slowest rank's sends: m per F or B of
    its stages that sends to another rank, each ``send_overhead_s``."""
    prof = Profile.load(FIXTURES / "gpt_profile.json")
    req = PlanRequest(
        devices=2,
        batch_size=16,
        memory_limit=2.0**34,
        micro_batches=8,
        schedule=schedule,
        virtual=virtual if virtual > 1 else None,
        recompute=Recompute.NEVER,
        link_bandwidth=1e15,
        link_latency_s=0.0,
        action_overhead_s=2e-4,
        send_overhead_s=5e-4,
    )
    plan = plan_pipeline(prof, req)
    span = predicted_split(plan)
    assert span.total_s == pytest.approx(plan.iteration_time_s)
    forward, backward = sends_of([s.rank for s in plan.stages])
    per_rank = {r: sum(8 * (forward[s.index] + backward[s.index]) for s in plan.stages if s.rank == r) for r in (0, 1)}
    assert span.messages_s == pytest.approx(5e-4 * per_rank[0], rel=1e-6) or span.messages_s == pytest.approx(
        5e-4 * per_rank[1], rel=1e-6
    )
    assert per_rank == ({0: 8, 1: 8} if virtual == 1 else {0: 24, 1: 24})
