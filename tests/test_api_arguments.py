"""The Python API checks its arguments' types before any work: one typed line (an InputError) each,
worded as the CLI words its flags, with the API's keywords (``stages must be a positive integer``
beside ``--stages must be a positive integer``), never a raw TypeError from deep inside."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import autopipe
from autopipe.costs.profile import Profile
from autopipe.errors import ConfigError, EmitError, InputError, ModelLoadError, PlanError, PlanFileError
from autopipe.plans import Plan
from tests.helpers import FIXTURES

PROFILE = Profile.load(FIXTURES / "good_mlp_profile_v1.json")
PLAN = Plan.load(FIXTURES / "good_mlp_plan_v1.json")
MODEL = str(FIXTURES / "good_mlp.py")
GOOD: dict[str, Any] = {"stages": 2, "batch_size": 8, "memory": "1GiB"}


def planned(**change: Any) -> Callable[[], object]:
    return lambda: autopipe.plan_profile(PROFILE, **{**GOOD, **change})


def clustered(**change: Any) -> Callable[[], object]:
    """The --gpus search of the fixture's profile (checked before any search)."""
    return lambda: autopipe.api.search_cluster(PROFILE, gpus=4, batch_size=8, memory="1GiB", **change)


def profiled(**change: Any) -> Callable[[], object]:
    return lambda: autopipe.plan(MODEL, **{**GOOD, **change})


CASES: dict[str, tuple[Callable[[], object], type[InputError], str]] = {
    "stages='2'": (planned(stages="2"), PlanError, "stages must be a positive integer (got '2', a str)"),
    "stages=2.5": (planned(stages=2.5), PlanError, "stages must be a positive integer (got 2.5, a float)"),
    "stages=True": (planned(stages=True), PlanError, "stages must be a positive integer (got True, a bool)"),
    "devices=0": (planned(stages=None, devices=0), PlanError, "stages must be at least 1 (got 0)"),  # validate's
    "batch_size='8'": (planned(batch_size="8"), PlanError, "batch_size must be a positive integer (got '8', a str)"),
    "plan(stages='2') before profiling": (
        profiled(stages="2"), PlanError, "stages must be a positive integer (got '2', a str)"),
    "kwargs='depth=3'": (
        profiled(kwargs="depth=3"), ModelLoadError,
        "kwargs must be a mapping of the factory's keyword arguments, like {'depth': 3} (got 'depth=3', a str)"),
    "action_overhead_s='1ms'": (
        lambda: autopipe.Link(action_overhead_s="1ms"), PlanError,
        "action_overhead_s must be a number of seconds, like 1e-3 for 1 ms (got '1ms', a str)"),
    "bandwidth='25GB/s'": (
        lambda: autopipe.Link(bandwidth="25GB/s"), PlanError,
        "bandwidth must be a number of bytes per second, like 25e9 for 25 GB/s (got '25GB/s', a str)"),
    "micro_batches='4'": (
        lambda: autopipe.Choices(micro_batches="4"), PlanError,
        "micro_batches must be a positive integer (got '4', a str)"),
    "schedule=1": (
        lambda: autopipe.Choices(schedule=1), PlanError, "schedule must be a name (a str), like 1f1b, not 1"),
    "link={}": (
        planned(link={}), PlanError, "link must be a Link, like Link(bandwidth=25e9, latency_s=20e-6), not a dict"),
    "choices=8": (
        planned(choices=8), PlanError,
        "choices must be a Choices, like Choices(micro_batches=8, schedule='1f1b'), not an int"),
    "balance='3,1'": (
        planned(balance="3,1"), PlanError, "balance must be a sequence of blocks per chunk, like 2, 1 (got '3,1')"),
    "balance=[1.5, 2]": (
        planned(balance=[1.5, 2]), PlanError,
        "balance entries must be positive block counts (got 1.5); every chunk needs at least one block"),
    "micro_batch_sizes=4": (
        profiled(micro_batch_sizes=4), PlanError,
        "micro_batch_sizes must be a sequence of positive integers, like (1, 2, 4) (got 4)"),
    "warmup='2'": (profiled(warmup="2"), PlanError, "warmup must be an integer from 0 to 1000 (got '2')"),
    "Plan.load(None)": (
        lambda: Plan.load(None), PlanFileError,  # type: ignore[arg-type]
        "Plan.load's path must be the path of a plan JSON (a str or a Path), not None"),
    "Plan.load(123)": (
        lambda: Plan.load(123), PlanFileError,  # type: ignore[arg-type]
        "Plan.load's path must be the path of a plan JSON (a str or a Path), not an int"),
    "pipeline(None, model)": (
        lambda: autopipe.pipeline(None, None), PlanFileError,  # type: ignore[arg-type]
        "plan must be a Plan or the path of its JSON (a str or a Path), not None"),
    "emit(plan, model, None)": (
        lambda: autopipe.emit(PLAN, None, None), EmitError,  # type: ignore[arg-type]
        "folder must be the folder to write the stages into (a str or a Path), not None"),
    "emit(None, ...)": (
        lambda: autopipe.emit(None, None, "stages"), EmitError,  # type: ignore[arg-type]
        "plan must be a Plan (autopipe.Plan.load(path)), not None"),
    "count(None, ...)": (
        lambda: autopipe.api.count(None, {}, autopipe.api.catalogue_device("cpu")), ModelLoadError,  # type: ignore[arg-type]
        "model must be a model file, path/to/model.py[:factory] (a str or a Path), not None"),
    "megatron_config(None)": (
        lambda: autopipe.api.megatron_config(None), ConfigError,  # type: ignore[arg-type]
        "plan must be a Plan (autopipe.Plan.load(path)), not None"),
    "check_config(plan, None)": (
        lambda: autopipe.api.check_config(PLAN, None), ConfigError,  # type: ignore[arg-type]
        "model must be a model file, path/to/model.py[:factory] (a str or a Path), not None"),
    "sharding='zero9'": (
        clustered(sharding="zero9"), PlanError, "sharding 'zero9': use one of none, zero1, zero2, zero3, zero3-step"),
    "zero1 and sharding='zero3'": (
        clustered(zero1=True, sharding="zero3"), PlanError, "zero1 and sharding=zero3 contradict each other; give one"),
    "shard_group='2'": (
        clustered(sharding="zero1", shard_group="2"), PlanError,
        "shard_group must be a positive integer (got '2', a str)"),
    "shard_group=1": (
        clustered(sharding="zero1", shard_group=1), PlanError,
        "shard_group=1: shard over 2 or more replicas (or leave it out)"),
    "shard_group alone": (
        clustered(shard_group=2), PlanError, "shard_group splits a sharding over fewer replicas; give sharding too"),
    "overlap=5": (
        clustered(overlap=5), PlanError, "overlap must be an Overlap or its text, like 'grad_reduce,p2p', not 5"),
}  # fmt: skip  # reason: one case per entry, its message whole


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_argument_is_one_typed_line(case: str) -> None:
    call, error, said = CASES[case]
    with pytest.raises(InputError) as info:
        call()
    assert type(info.value) is error or isinstance(info.value, error), type(info.value)
    assert str(info.value) == said


def test_numpy_integers_are_integers() -> None:
    numpy = pytest.importorskip("numpy")
    plan = autopipe.plan_profile(PROFILE, stages=numpy.int64(2), batch_size=numpy.int32(8), memory="1GiB")
    assert plan.devices == 2 and plan.batch_size == 8
