"""The search's fast pricing of a candidate equals the event simulator; the executor's costs per
action and per send, priced by hand."""

from __future__ import annotations

import dataclasses
import random

import pytest

from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.planner.assemble import plan_timeline
from autopipe.planner.pricing import Decision, compiled, with_sends
from autopipe.planner.request import PlanRequest
from autopipe.planner.search import plan_pipeline
from autopipe.planner.splits import price_split
from autopipe.plans import Plan
from autopipe.schedules import make_schedule
from autopipe.simulate.events import StageCost, compile_schedule, simulate, simulate_summary


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b"])
def test_fast_simulation_equals_the_event_simulator(name: str) -> None:
    rng = random.Random(7)
    S, m, v = 4, 8, (2 if name == "interleaved-1f1b" else 1)
    costs = [
        StageCost(
            rng.random(),
            rng.random() * 2,
            rng.random(),
            rng.random(),
            rng.random() * 100,
            rng.random() * 50,
            rng.random() * 10,
            rng.random() * 1000,
        )
        for _ in range(S * v)
    ]
    comm = [rng.random() * 0.1 for _ in range(S * v - 1)]
    schedule = make_schedule(name, S, m, v)
    full = simulate(schedule, costs, comm, devices=S)
    fast = simulate_summary(compile_schedule(schedule, S, v), costs, comm)
    assert fast.iteration_s == pytest.approx(full.iteration_s, rel=1e-12)
    assert fast.bubble_fraction == pytest.approx(full.bubble_fraction, rel=1e-9)
    assert fast.peak_memory_bytes == pytest.approx(full.peak_memory_bytes, rel=1e-12)
    assert compiled(name, S, m, v).rank.tolist() == compile_schedule(schedule, S, v).rank.tolist()


def test_blocking_sends_cost_the_sender_and_arrive_as_it_ends() -> None:
    """GPipe on 2 stages, 1 micro-batch, 0.5 s sends: asynchronous, F0 [0, 1], F1 [1.5, 2.5], B1
    [2.5, 4.5], B0 [5, 7]; blocking, the sends are in F0 and B1 (each 0.5 s longer) and arrive as they
    end: F0 [0, 1.5], F1 [1.5, 2.5], B1 [2.5, 5], B0 [5, 7]: the same 7 s, stage 0 busy 0.5 s longer."""
    cost = StageCost(1.0, 2.0, 2.0, 0.0, 0.0)
    blocked = with_sends([cost, cost], (0.5,))
    assert (blocked[0].forward_s, blocked[0].backward_s) == (1.5, 2.0)
    assert (blocked[1].forward_s, blocked[1].backward_s, blocked[1].backward_input_s) == (1.0, 2.5, 2.5)
    schedule = compile_schedule(make_schedule("gpipe", 2, 1, 1), 2, 1)
    free = simulate_summary(schedule, [cost, cost], [0.5])
    held = simulate_summary(schedule, blocked, [])
    assert (free.iteration_s, held.iteration_s) == (7.0, 7.0)
    assert held.rank_busy_s == (3.5, 3.5) and free.rank_busy_s == (3.0, 3.0)


# -- the executor's cost per action and per send, by hand (issue 28) ---------------------------------

ACTION, SEND = 0.1, 0.5  # seconds per action, and per action that sends to another rank on top


def _even_chain(n: int) -> Profile:
    """n blocks, each F 1 s, B 2 s (B 1 s + W 1 s split), nothing saved, nothing crossing."""
    block = BlockCost(
        name="b",
        nodes=("n",),
        params=0,
        param_bytes=0,
        forward_s=Affine(1.0, 0.0),
        backward_s=Affine(2.0, 0.0),
        backward_input_s=Affine(1.0, 0.0),
        backward_weight_s=Affine(1.0, 0.0),
        saved_bytes=Affine(0.0, 0.0),
    )
    blocks = tuple(dataclasses.replace(block, name=f"b{i}", nodes=(f"n{i}",)) for i in range(n))
    tensors = tuple(TensorCost(f"n{i}", i, (i + 1,), Affine(0.0, 0.0)) for i in range(n - 1))
    return Profile("chain", TraceRecipe(tracer="fx"), "cpu", "2", "float32", (1,), "measured", blocks, tensors)


def _priced(schedule: str, virtual: int = 1) -> tuple[list[StageCost], float, Plan]:
    prof = _even_chain(2 * virtual)
    req = PlanRequest(
        devices=2,
        batch_size=2,
        memory_limit=2.0**40,
        micro_batches=2,
        schedule=schedule,
        virtual=virtual if virtual > 1 else None,
        recompute="never",  # type: ignore[arg-type]
        link_bandwidth=1e9,
        link_latency_s=0.0,
        action_overhead_s=ACTION,
        send_overhead_s=SEND,
    )
    c, summary = price_split(prof, req, Decision(schedule, virtual, 2), [1] * (2 * virtual))
    plan = plan_pipeline(prof, req)
    return c.costs, summary.iteration_s, plan


def _times(costs: list[StageCost], split: bool = False) -> list[tuple[float, ...]]:
    """Per stage, what the schedule runs: F and B, or F, B (input-gradient) and W."""
    return [
        tuple(
            round(x, 9)
            for x in ((c.forward_s, c.backward_input_s, c.backward_weight_s) if split else (c.forward_s, c.backward_s))
        )
        for c in costs
    ]


def test_1f1b_pays_a_send_in_stage_0s_f_and_stage_1s_b() -> None:
    """1F1B, 2 stages, m = 2, F 1 + 0.1, B 2 + 0.1, a send 0.5 more: stage 0 F 1.6 B 2.1, stage 1
    F 1.1 B 2.6::

        rank 0 |0F0 0-1.6|0F1 1.6-3.2|   wait   |0B0 5.3-7.4| wait |0B1 9.0-11.1|
        rank 1 |  wait   |1F0 1.6-2.7|1B0 2.7-5.3|1F1 5.3-6.4|1B1 6.4-9.0|

    11.1 s (9.6 s with the action's cost alone: the critical path 0F0 1B0 1B1 sends three times)."""
    costs, iteration, plan = _priced("1f1b")
    assert _times(costs) == [(1.6, 2.1), (1.1, 2.6)]
    assert iteration == pytest.approx(11.1)
    assert plan.iteration_time_s == pytest.approx(11.1) and plan.send_overhead_s == SEND
    assert [s.forward_s for s in plan.stages] == pytest.approx([1.6, 1.1])
    assert plan_timeline(plan).iteration_s == pytest.approx(11.1)  # the simulator prices it the same


def test_interleaved_pays_a_send_in_every_f_but_the_last_and_every_b_but_the_first() -> None:
    """Interleaved 1F1B, 2 ranks x 2 chunks (0 2 on rank 0, 1 3 on rank 1), m = 2: chunks 0-2's F
    1.6, chunk 3's 1.1; chunk 0's B 2.1, chunks 1-3's 2.6::

        rank 0 |0F0 0-1.6|0F1 -3.2|2F0 3.2-4.8|2F1 -6.4| wait |2B0 10.1-12.7|2B1 -15.3|0B0 -17.4|w|0B1 17.9-20.0|
        rank 1 | wait |1F0 1.6-3.2|1F1 -4.8|3F0 -5.9|w|3F1 6.4-7.5|3B0 -10.1|3B1 -12.7|1B0 -15.3|1B1 -17.9|

    20.0 s."""
    costs, iteration, plan = _priced("interleaved-1f1b", 2)
    assert _times(costs) == [(1.6, 2.1), (1.6, 2.6), (1.6, 2.6), (1.1, 2.6)]
    assert iteration == pytest.approx(20.0)
    assert plan.iteration_time_s == pytest.approx(20.0) and plan_timeline(plan).iteration_s == pytest.approx(20.0)


def test_zb_h1_pays_a_send_in_stage_0s_f_and_stage_1s_b_not_in_w() -> None:
    """ZB-H1, 2 stages, m = 2: stage 0's B is all W (B 0.1, W 2.1, F 1.6), stage 1 F 1.1, B
    1 + 0.1 + 0.5 = 1.6, W 1.1::

        rank 0 |0F0 0-1.6|0F1 -3.2| wait |0B0 4.3-4.4|0W0 -6.5| w |0B1 7.0-7.1|0W1 -9.2|
        rank 1 | wait |1F0 1.6-2.7|1B0 -4.3|1F1 -5.4|1B1 -7.0|1W0 -8.1|1W1 -9.2|

    9.2 s."""
    costs, iteration, plan = _priced("zb-h1")
    assert _times(costs, split=True) == [(1.6, 0.1, 2.1), (1.1, 1.6, 1.1)]
    assert iteration == pytest.approx(9.2)
    assert plan.iteration_time_s == pytest.approx(9.2) and plan_timeline(plan).iteration_s == pytest.approx(9.2)


def test_the_first_stage_keeps_nothing_from_b_to_w() -> None:
    """Its inputs are the batch: B computes nothing, W is the whole backward (split_backward),
    so none of its blocks' kept bytes are held; the other stages hold their blocks' sum."""
    from autopipe.planner.pricing import BlockTimes, executor_bytes

    t = BlockTimes(
        f=(1.0,) * 4, b=(2.0,) * 4, bi=(1.0,) * 4, w=(1.0,) * 4, kept=(5.0, 7.0, 11.0, 13.0), made=(1.0, 4.0, 2.0, 3.0)
    )
    kept, made = executor_bytes((0, 0, 1, 1), 2, t)
    assert kept == [0.0, 24.0] and made == [4.0, 3.0]
