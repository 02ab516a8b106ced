"""``--target`` in every planning mode: the search, ``--balance`` and ``--gpus`` (autopipe/schedules/targets.py).

Seeded random models and requests: every plan made for Megatron-LM or torchtitan has a schedule
and a recomputation the framework runs as priced, records its target, and keeps the free plan's
prediction beside its own (never faster than the free plan's).
"""

from __future__ import annotations

import random

import pytest

import autopipe.api as api
from autopipe.errors import InfeasibleError
from autopipe.planner.cluster import target_overlap
from autopipe.schedules.targets import target_spec
from tests.planner.test_search import random_profile

_MODES = ("search", "balance", "gpus")


def _case(seed: int) -> tuple[str, str, dict[str, object]]:
    rng = random.Random(seed)
    mode, target = _MODES[seed % 3], ("megatron", "torchtitan")[seed // 3 % 2]
    n = rng.randint(4, 12)
    prof = random_profile(n, seed, skips=rng.randint(0, 1))
    devices = rng.randint(2, min(4, n))
    batch = rng.choice([4, 8, 12, 16])
    need = max(
        api.plan_profile(
            prof, devices=devices, batch_size=batch, memory=2**40, choices=api.Choices(recompute="always")
        ).peak_memory_bytes
    )
    kw: dict[str, object] = {"profile": prof, "batch_size": batch, "memory": need * rng.uniform(1.0, 1.8)}
    if mode == "gpus":
        kw.update(gpus=devices * rng.choice([1, 2]), stages=devices)
    else:
        kw["devices"] = devices
    if mode == "balance":
        cuts = sorted(rng.sample(range(1, n), devices - 1))
        kw["balance"] = [b - a for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    return mode, target, kw


def _planned(mode: str, target: str, kw: dict[str, object], priced_for: str | None = None) -> api.Plan:
    """The plan for ``target``; with ``--gpus``, priced with ``priced_for``'s overlaps (a targeted
    plan's free plan keeps its target's: what the framework overlaps is no choice of the search)."""
    kw = dict(kw, choices=api.Choices(target=target))
    prof = kw.pop("profile")
    if mode == "gpus":
        overlap = target_overlap(priced_for or target)
        return api.search_cluster(prof, overlap=overlap, **kw).plan  # type: ignore[arg-type]
    return api.plan_profile(prof, **kw)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_every_targeted_plan_runs_on_its_target_in_every_mode(seed: int) -> None:
    mode, target, kw = _case(seed)
    try:
        plan = _planned(mode, target, kw)
    except InfeasibleError:
        return  # recomputing every stage or none needs more memory than per stage: nothing may fit
    spec = target_spec(target)
    assert spec.runs(plan.schedule, [s.recompute for s in plan.stages]), (mode, plan.schedule)
    assert plan.schedule in spec.schedules and len({s.recompute for s in plan.stages}) == 1
    assert plan.target == target and plan.free_plan is not None
    free = _planned(mode, "autopipe", kw, priced_for=target)
    assert free.target == "autopipe" and free.free_plan is None
    assert plan.free_plan.schedule == free.schedule and plan.free_plan.step_time_s == free.step_time_s
    assert plan.step_time_s >= free.step_time_s * (1 - 1e-9)
    if mode == "balance":
        assert plan.balance == tuple(kw["balance"])  # type: ignore[arg-type]


def test_a_v_balance_for_megatron_is_one_line() -> None:
    prof = random_profile(8, 1)
    with pytest.raises(api.PlanError, match=r"^target=megatron schedule=v-half: Megatron-LM runs 1f1b and "):
        api.plan_profile(
            prof,
            devices=2,
            batch_size=8,
            memory=2**40,
            balance=[2, 2, 2, 2],
            choices=api.Choices(schedule="v-half", target="megatron"),
        )


@pytest.fixture(scope="module")
def counted() -> dict[str, tuple[api.Profile, api.ModelCounts, api.DeviceSpec]]:
    spec = api.catalogue_device("h100")
    out = {}
    for model, kwargs in (("models/gpt.py", {"preset": "gpt3-1.3b"}), ("models/llama.py", {"preset": "llama2-7b"})):
        counts = api.count(model, kwargs, spec)
        out[model] = (api.price(counts, spec), counts, spec)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_megatron_plans_of_real_models_run_on_megatron(
    seed: int, counted: dict[str, tuple[api.Profile, api.ModelCounts, api.DeviceSpec]]
) -> None:
    rng = random.Random(seed)
    model = ("models/gpt.py", "models/llama.py")[seed % 2]
    prof, counts, spec = counted[model]
    mode = ("search", "balance", "gpus")[rng.randrange(3)]
    devices, batch = rng.choice([4, 8]), rng.choice([8, 16, 32])
    kw: dict[str, object] = {"batch_size": batch, "memory": rng.choice(["64GiB", "80GiB"]), "device": spec}
    if mode == "gpus":
        kw.update(gpus=devices * 2, counts=counts)
    else:
        kw["devices"] = devices
    if mode == "balance":
        n = prof.num_blocks
        kw["balance"] = [n // devices + (i < n % devices) for i in range(devices)]

    def planned(target: str) -> api.Plan:
        choices = api.Choices(target=target)
        if mode == "gpus":  # priced with Megatron's overlaps, as the targeted plan's free plan is
            overlap = target_overlap("megatron")
            return api.search_cluster(prof, choices=choices, overlap=overlap, **kw).plan  # type: ignore[arg-type]
        return api.plan_profile(prof, choices=choices, **kw)  # type: ignore[arg-type]

    plan = planned("megatron")  # every case fits (64 GiB or more per H100, 4 or more stages)
    assert target_spec("megatron").runs(plan.schedule, [s.recompute for s in plan.stages]), (mode, plan.schedule)
    assert plan.free_plan is not None and plan.step_time_s >= plan.free_plan.step_time_s * (1 - 1e-9)
    assert plan.free_plan == api.FreePlan.of(planned("autopipe"))
