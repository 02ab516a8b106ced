"""From the search's best candidate to a Plan: stages by name, predictions, runners-up and
the simple splits priced under the same schedule; and the Plan's timeline simulated again.

Tests: tests/planner/test_search.py.
"""

from __future__ import annotations

import math

from autopipe.costs.profile import Profile
from autopipe.partition.baselines import BASELINES, baseline_assignment
from autopipe.partition.problem import evaluate, stage_stats
from autopipe.planner.pricing import Candidate, Decision, Priced, candidate, executor_bytes, fits, price
from autopipe.planner.request import PlanRequest
from autopipe.plans import Alternative, Baseline, Plan, StagePlan
from autopipe.schedules import schedule_spec
from autopipe.simulate.events import StageCost, Summary, Timeline
from autopipe.simulate.replay import replay

__all__ = ["make_plan", "plan_comm", "plan_costs", "plan_timeline"]


def make_plan(
    profile: Profile,
    req: PlanRequest,
    best: Candidate,
    timeline: Summary,
    fitting: list[Priced],
) -> Plan:
    """The Plan of candidate ``best`` (simulated as ``timeline``); ``fitting`` are all the
    candidates that fit, best first, for the runners-up."""
    d = best.decision
    u = best.times.u
    part = best.partition
    stats = stage_stats(best.problem, part.stage_of_block)
    kept, made = executor_bytes(part.stage_of_block, best.problem.stages, best.times)
    placed = schedule_spec(d.schedule).devices_of(req.devices, d.virtual)
    stages = []
    for s in range(best.problem.stages):
        members = tuple(i for i, x in enumerate(part.stage_of_block) if x == s)
        rc = part.recompute[s]
        stages.append(
            StagePlan(
                index=s,
                rank=placed[s],
                blocks=tuple(profile.blocks[i].name for i in members),
                block_indices=members,
                nodes=tuple(n for i in members for n in profile.blocks[i].nodes),
                params=sum(profile.blocks[i].params for i in members),
                forward_s=best.costs[s].forward_s,
                backward_s=best.costs[s].backward_s,
                backward_input_s=best.costs[s].backward_input_s,
                backward_weight_s=best.costs[s].backward_weight_s,
                recompute=rc,
                memory_bytes=timeline.peak_memory_bytes[s] if d.virtual == 1 else part.stage_memory_bytes[s],
                static_bytes=stats.static[s],
                activation_bytes=stats.act[s],
                held_bytes=stats.in_bytes[s] if rc else stats.act[s],
                send_bytes=part.cut_bytes[s] if s < len(part.cut_bytes) else 0.0,
                transient_bytes=stats.layer_peak[s] if stats.layer_peak and not rc else 0.0,
                kept_bytes=0.0 if rc else kept[s],
                backward_bytes=made[s],
            )
        )
    alternatives = _alternatives(req, d, fitting)
    return Plan(
        model=profile.model,
        recipe=profile.recipe,
        profile_device=profile.device,
        devices=req.devices,
        virtual=d.virtual,
        schedule=d.schedule,
        micro_batches=d.micro_batches,
        micro_batch_size=u,
        batch_size=req.batch_size,
        memory_limit_bytes=req.memory_limit,
        link_bandwidth=req.link_bandwidth,
        link_latency_s=req.link_latency_s,
        action_overhead_s=req.action_overhead_s,
        send_overhead_s=req.send_overhead_s,
        recompute_policy=req.recompute,
        stages=tuple(stages),
        iteration_time_s=timeline.iteration_s,
        bubble_fraction=timeline.bubble_fraction,
        throughput=req.batch_size / timeline.iteration_s if timeline.iteration_s > 0 else math.inf,
        peak_memory_bytes=timeline.peak_memory_bytes,
        alternatives=alternatives,
        baselines=tuple(_baselines(profile, req, best)),
        target=req.target,
        recompute_modules=d.memory.recompute,
        recompute_layers=d.memory.layers,
        offload_modules=d.memory.offload,
    )


def _alternatives(req: PlanRequest, chosen: Decision, fitting: list[Priced]) -> tuple[Alternative, ...]:
    """The best candidate of each other decision (memory choice included), fastest first."""
    seen = {chosen}
    alternatives: list[Alternative] = []
    for c, t in fitting[1:]:
        if c.decision in seen or len(alternatives) >= req.alternatives:
            continue
        seen.add(c.decision)
        alternatives.append(
            Alternative(
                c.decision.schedule,
                c.decision.virtual,
                c.decision.micro_batches,
                t.iteration_s,
                t.bubble_fraction,
                max(t.peak_memory_bytes),
                c.source,
                "" if c.decision.memory.none else c.decision.memory.said,
            )
        )
    return tuple(alternatives)


def _baselines(profile: Profile, req: PlanRequest, best: Candidate) -> list[Baseline]:
    """The simple splits under the chosen decision, without recomputation (as others run them)."""
    d, p, times = best.decision, best.problem, best.times
    out = []
    for name in BASELINES:
        assignment = baseline_assignment(name, tuple(float(b.params) for b in profile.blocks), p.time_s, p.stages)
        rc = (p.recompute == "always",) * p.stages
        part = evaluate(p, assignment, rc)
        c = candidate(d, name, p, part, times)
        t = price(c, req.devices)
        sizes = tuple(assignment.count(s) for s in range(p.stages))
        out.append(
            Baseline(name, sizes, t.iteration_s, t.bubble_fraction, t.peak_memory_bytes, fits(t, req.memory_limit))
        )
    return out


def plan_costs(plan: Plan) -> list[StageCost]:
    """What each of ``plan``'s stages costs the simulator (its own numbers)."""
    return [
        StageCost(
            forward_s=s.forward_s,
            backward_s=s.backward_s,
            backward_input_s=s.backward_input_s,
            backward_weight_s=s.backward_weight_s,
            activation_bytes=s.held_bytes,
            weight_grad_bytes=s.held_bytes + s.kept_bytes,
            transient_bytes=(s.activation_bytes if s.recompute else s.transient_bytes) + s.backward_bytes,
            static_bytes=s.static_bytes,
        )
        for s in plan.stages
    ]


def plan_comm(plan: Plan) -> list[float]:
    """Each stage boundary's link time as ``plan`` priced it (none where its sends block the sender:
    its stage times hold them, ``pricing.with_sends``)."""
    if not plan.overlap.p2p:
        return []
    return [
        plan.link_latency_s + s.send_bytes / plan.link_bandwidth if s.send_bytes > 0 else 0.0 for s in plan.stages[:-1]
    ]


def plan_timeline(plan: Plan) -> Timeline:
    """Simulate ``plan`` again from its own numbers (what ``autopipe show`` draws)."""
    costs = plan_costs(plan)
    comm = plan_comm(plan)
    spec = schedule_spec(plan.schedule)
    schedule = spec.create_schedule(plan.devices, plan.micro_batches, plan.virtual)
    return replay(
        schedule, costs, comm, devices=plan.devices, virtual=plan.virtual, placement=spec.placement
    )  # simulate's, fast
