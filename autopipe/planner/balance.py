"""A user's own split, priced: ``autopipe plan --balance 3,1,1,3`` and ``plan_profile(balance=)``.

``balance`` is blocks per chunk in chunk order (S entries for one-chunk schedules, S·v for
interleaved and V schedules, which then need the schedule named). It is priced with
:func:`~autopipe.planner.splits.price_split`, the function the search prices every split with,
under each decision the request allows (S entries and no schedule: the one-chunk schedules
only; a pinned memory choice, ``--recompute-modules`` and the like, on every layer); the fastest
that fits is the plan. autopipe's own best plan for the same request is
recorded beside it, as the baseline named ``autopipe`` (with its schedule and m when they differ).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from autopipe.costs.activations.choices import apply
from autopipe.costs.profile import Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.modes import Recompute
from autopipe.planner.assemble import make_plan
from autopipe.planner.context import SearchContext
from autopipe.planner.pricing import Priced, fits
from autopipe.planner.request import PlanRequest, decisions, target_spec, validate
from autopipe.planner.search import plan_search
from autopipe.planner.splits import check_balance, price_split, problem_of
from autopipe.plans import Baseline, Plan
from autopipe.schedules import schedule_spec
from autopipe.units import format_bytes

__all__ = ["plan_balance"]


def plan_balance(profile: Profile, request: PlanRequest, balance: Sequence[int], flag: str = "--balance") -> Plan:
    """The plan of the user's split ``balance``, priced, with autopipe's best beside it
    (PlanError naming ``flag`` for a bad balance; InfeasibleError when it fits nowhere)."""
    validate(profile, request)
    v = check_balance(balance, profile.num_blocks, request.devices, request.schedule, request.virtual, flag)
    sizes = [int(x) for x in balance]
    priced: list[Priced] = []
    pin = request.memory_pin  # a pinned memory choice prices the split under it (costs.activations.choices)
    chosen = apply(profile, pin, request.host_bandwidth) if pin is not None else profile
    modes = _modes(request) if pin is None or pin.none else [replace(request, recompute=Recompute.NEVER)]
    for req in modes:  # a target that recomputes every stage or none: both
        ctx = SearchContext(chosen, req)
        for d in decisions(chosen, req):
            if d.virtual != v:
                continue
            size = ctx.size(d)
            problem = problem_of(chosen, req, d, size.numbers)
            priced.append(price_split(chosen, req, d, sizes, problem=problem, times=size.times, source="balance"))
    if not priced:
        raise PlanError(
            f"no schedule asked runs {v} chunk{'s' if v > 1 else ''} per device for {flag} "
            f"{','.join(map(str, sizes))}; name one with {'--schedule' if flag.startswith('--') else 'schedule='}"
        )
    fitting = sorted((x for x in priced if fits(x.summary, request.memory_limit)), key=_key)
    if not fitting:
        need = min((max(t.peak_memory_bytes) for _, t in priced), default=math.inf)
        raise InfeasibleError(
            f"the split {','.join(map(str, sizes))} does not fit "
            f"{format_bytes(request.memory_limit)} per device under any "
            f"schedule and micro-batch count asked; it needs {format_bytes(need, round_up=True)} per device "
            "(raise --memory, allow recomputation, or move blocks off the fullest device)",
            min_memory_bytes=need if math.isfinite(need) else None,
        )
    c, t = fitting[0]
    plan = make_plan(profile, request, c, t, fitting)
    try:
        ours = plan_search(profile, request)
    except InfeasibleError:
        return plan  # nothing of autopipe's fits: the user's split stands alone
    best, bt = ours[0]
    same = best.decision == c.decision
    d = best.decision
    name = (
        "autopipe"
        if same
        else f"autopipe ({d.schedule}{f' v={d.virtual}' if d.virtual > 1 else ''}, m={d.micro_batches})"
    )
    blocks = tuple(best.partition.stage_of_block.count(j) for j in range(best.problem.stages))
    mine = Baseline(name, blocks, bt.iteration_s, bt.bubble_fraction, bt.peak_memory_bytes, True)
    return replace(plan, baselines=(mine, *plan.baselines))


def _modes(request: PlanRequest) -> list[PlanRequest]:
    """The request, or where its target recomputes every stage or none and recomputation is left
    to the search, the request with nothing recomputed and with everything."""
    if request.recompute == "auto" and target_spec(request.target).uniform_recompute:
        return [replace(request, recompute=mode) for mode in (Recompute.NEVER, Recompute.ALWAYS)]
    return [request]


def _key(ct: Priced) -> tuple[float, int, int, int]:
    d = ct.candidate.decision
    return (ct.summary.iteration_s, schedule_spec(d.schedule).preference, d.virtual, d.micro_batches)
