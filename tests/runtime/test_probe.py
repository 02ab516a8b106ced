"""The executor's own costs measured with the real engine (runtime/probe.py) and kept in the profile."""

from __future__ import annotations

import math

import pytest
import torch

from autopipe.api import executor_probe
from autopipe.costs.measure.measured import executor_cost, profile_model
from autopipe.costs.profile import Profile
from autopipe.runtime import probe
from tests.costs.measure.test_measured import _loaded
from tests.helpers import Net


def test_the_probe_gives_one_estimate_of_each_cost_per_round() -> None:
    torch.set_num_threads(1)
    samples = probe.measure_executor(rounds=3)
    assert samples is not None  # gloo runs on this CPU
    assert len(samples.action_s) == len(samples.send_s) == 3
    assert all(math.isfinite(x) and 0.0 <= x < 1.0 for x in (*samples.action_s, *samples.send_s))


def test_a_probe_that_cannot_run_leaves_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gloo() -> list[object]:
        raise RuntimeError("no gloo here")

    monkeypatch.setattr(probe, "_gloo_pair", no_gloo)
    assert probe.measure_executor(rounds=1) is None
    assert not executor_cost(None) and not executor_cost(((), ()))


def test_the_profile_records_the_cost_per_action_and_per_send() -> None:
    torch.manual_seed(0)
    prof = profile_model(
        _loaded(Net(d=16, n=1)), micro_batch_sizes=[1], warmup=0, repeat=1, contention=False, executor=executor_probe
    )
    e = prof.executor
    assert e.measured and e.action_s >= 0.0 and e.send_s >= 0.0 and e.action_spread >= 0.0 and e.send_spread >= 0.0
    assert Profile.from_json(prof.to_json()).executor == e
    without = profile_model(_loaded(Net(d=16, n=1)), micro_batch_sizes=[1], warmup=0, repeat=1, contention=False)
    assert not without.executor  # not asked: the planner's defaults
