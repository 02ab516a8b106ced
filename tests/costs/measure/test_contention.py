"""Ranks sharing a host: the probe (costs/measure/contention.py), the Contention value and how the planner prices it."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from autopipe import api
from autopipe.costs.measure import contention
from autopipe.costs.measure.contention import Probe, counts_for, slowdowns
from autopipe.costs.profile import Contention, Profile
from autopipe.errors import ProfileError
from autopipe.planner.defaults import host_shared, with_host_sharing
from autopipe.planner.search import PlanRequest, plan_pipeline
from tests.planner.test_noise import profile_of

SHARED = Contention(workers=(1, 2, 4), slowdown=(1.0, 1.5, 3.0), spread=(0.0, 0.04, 0.1), cores=2, threads=1)


def test_counts_cover_twice_the_cores_in_powers_of_two() -> None:
    assert counts_for(1) == (1, 2)
    assert counts_for(2) == (1, 2, 4)
    assert counts_for(6) == (1, 2, 4, 6, 8)
    assert counts_for(64) == (1, 2, 4, 8, 16)  # at most MAX_WORKERS


def test_slowdowns_are_solo_units_over_the_mean_per_count_median_over_rounds() -> None:
    rounds = [{1: [100], 2: [50, 50]}, {1: [90], 2: [60, 30]}, {1: [100], 2: [100, 100]}]
    slow, spread, ks = slowdowns(rounds)
    assert ks == (1, 2)
    assert slow[0] == 1.0 and spread[0] == 0.0
    assert slow[1] == pytest.approx(2.0)  # the rounds' 2.0, 2.0, 1.0
    assert spread[1] > 0


def test_slowdown_interpolates_between_counts_and_extrapolates_oversubscription() -> None:
    assert SHARED.slowdown_at(1) == (1.0, 0.0)
    assert SHARED.slowdown_at(2) == (1.5, 0.04)
    assert SHARED.slowdown_at(3) == (pytest.approx(2.25), 0.1)
    assert SHARED.slowdown_at(8) == (pytest.approx(6.0), 0.1)  # 4 workers filled the 2 cores: x 8/4
    held = dataclasses.replace(SHARED, cores=8)  # 4 workers did not fill 8 cores: held
    assert held.slowdown_at(8) == (3.0, 0.1)


def test_factor_is_many_ranks_over_one_rank_of_the_profiles_threads() -> None:
    assert SHARED.factor(1) == (1.0, 0.0)
    assert SHARED.factor(2) == (1.5, 0.04)
    two_threads = dataclasses.replace(SHARED, threads=2)  # 2 ranks x 2 threads = 4 workers, over 2 alone
    assert two_threads.factor(2) == (pytest.approx(2.0), pytest.approx(0.14))
    assert Contention().factor(8) == (1.0, 0.0)  # not measured: one rank alone
    fast = dataclasses.replace(SHARED, slowdown=(1.0, 0.9, 1.8))  # never priced faster than alone
    assert fast.factor(2)[0] == 1.0


def test_profile_keeps_contention_and_leaves_it_out_when_not_measured() -> None:
    plain = profile_of([1e-3, 1e-3])
    assert "contention" not in json.loads(plain.to_json())
    shared = dataclasses.replace(plain, contention=SHARED)
    again = Profile.from_json(shared.to_json())
    assert again.contention == SHARED


@pytest.mark.parametrize(
    "bad",
    [
        {"workers": [2, 4], "slowdown": [1.0, 2.0], "spread": [0, 0], "cores": 2},
        {"workers": [1, 2], "slowdown": [1.0], "spread": [0, 0], "cores": 2},
        {"workers": [1, 2], "slowdown": [1.0, -2.0], "spread": [0, 0], "cores": 2},
        {"workers": [1, 2], "slowdown": [1.0, 2.0], "spread": [0, 0], "cores": 0},
    ],
)
def test_a_bad_contention_object_is_one_line(bad: dict[str, object]) -> None:
    raw = json.loads(profile_of([1e-3, 1e-3]).to_json())
    raw["contention"] = bad
    with pytest.raises(ProfileError, match=r"^profile has a bad contention object .*; profile again$"):
        Profile.from_json(json.dumps(raw))
    raw["contention"] = {"workers": "1,2"}
    with pytest.raises(ProfileError, match=r"^profile is corrupt \(TypeError: contention.workers is '1,2'"):
        Profile.from_json(json.dumps(raw))


REQUEST = PlanRequest(  # no link time, so the factor scales the whole iteration
    devices=2,
    batch_size=4,
    memory_limit=2.0**40,
    micro_batches=4,
    schedule="1f1b",
    action_overhead_s=1e-4,
    send_overhead_s=2e-4,
    link_bandwidth=1e30,
    link_latency_s=0.0,
)


def test_host_shared_prices_the_ranks_at_the_measured_factor() -> None:
    plain = profile_of([1e-3, 2e-3, 1e-3], spread=0.02)
    shared = dataclasses.replace(plain, contention=SHARED)
    prof, req, factor, spread = host_shared(shared, REQUEST)
    assert (factor, spread) == (1.5, 0.04)
    assert req.action_overhead_s == pytest.approx(1.5e-4) and req.send_overhead_s == pytest.approx(3e-4)
    for a, b in zip(prof.blocks, plain.blocks, strict=True):
        assert a.forward_s(2) == pytest.approx(1.5 * b.forward_s(2))
        assert a.backward_weight_s(2) == pytest.approx(1.5 * b.backward_weight_s(2))
        assert a.saved_bytes == b.saved_bytes and a.spread == b.spread  # memory and the blocks' spread as they were
    base = plan_pipeline(plain, REQUEST)
    plan = with_host_sharing(plan_pipeline(prof, req), factor, spread)
    assert plan.balance == base.balance  # one factor for every candidate: no choice moves
    assert plan.iteration_time_s == pytest.approx(1.5 * base.iteration_time_s)
    assert plan.host_sharing == 1.5
    assert plan.uncertainty == pytest.approx((1 + base.uncertainty) * 1.04 - 1)
    assert json.loads(plan.to_json())["host_sharing"] == 1.5
    assert "host_sharing" not in json.loads(base.to_json())


def test_host_shared_leaves_analytic_gpu_and_unmeasured_profiles_alone() -> None:
    shared = dataclasses.replace(profile_of([1e-3, 1e-3]), contention=SHARED)
    for other in (
        dataclasses.replace(shared, method="analytic"),
        dataclasses.replace(shared, device="cuda: NVIDIA H100"),
        dataclasses.replace(shared, contention=Contention()),
    ):
        prof, req, factor, spread = host_shared(other, REQUEST)
        assert (prof, req, factor, spread) == (other, REQUEST, 1.0, 0.0)


def test_plan_profile_records_the_sharing_it_priced() -> None:
    shared = dataclasses.replace(profile_of([1e-3, 2e-3, 1e-3]), contention=SHARED)
    free = api.Link(bandwidth=1e30, latency_s=0.0)
    plan = api.plan_profile(shared, devices=2, batch_size=4, memory="1GB", link=free)
    alone = api.plan_profile(
        dataclasses.replace(shared, contention=Contention()), devices=2, batch_size=4, memory="1GB", link=free
    )
    assert plan.host_sharing == 1.5
    assert plan.iteration_time_s == pytest.approx(1.5 * alone.iteration_time_s)


@pytest.mark.slow
def test_the_probe_measures_this_host() -> None:
    """Real worker processes: one count per measured count, solo 1, every slowdown positive; four
    workers on a host of fewer cores are slower than one (they cannot all have a core)."""
    with Probe(threads=1) as probe:
        probe.measure(2)
    got = probe.result()
    assert got.workers == counts_for(got.cores) and got.slowdown[0] == 1.0
    assert all(x > 0 for x in got.slowdown)
    if got.cores < 4:
        assert got.slowdown_at(4)[0] > 1.2
    assert not any(w.poll() is None for w in probe._workers)  # stopped


@pytest.mark.slow
def test_a_probe_whose_workers_do_not_answer_leaves_no_contention(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(contention, "_WORKER", "import sys; sys.exit(0)")
    with caplog.at_level(logging.WARNING, logger="autopipe"), Probe() as probe:
        probe.measure(2)
    assert probe.result() == Contention()
    assert "could not measure how ranks share this host" in caplog.text
