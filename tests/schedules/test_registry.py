"""Every registered schedule keeps the facts its spec states: its action lists validate, its
in-flight count bounds what the simulator holds, its textbook bubble is the simulated one, and
the simulator, the planner and the executor's routing place its chunks where the spec does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import cast

import pytest
import torch

from autopipe.errors import PlanError, ScheduleError
from autopipe.plans import Plan
from autopipe.runtime.routing import make_routing
from autopipe.runtime.run.worker import plan_schedule
from autopipe.schedules import (
    SCHEDULES,
    SPECS,
    Action,
    Kind,
    ScheduleSpec,
    make_schedule,
    parse_schedule,
    round_robin,
    schedule_names,
    schedule_spec,
    search_order,
    validate,
)
from autopipe.simulate.events import StageCost, compile_schedule, simulate, simulate_summary
from autopipe.stages.split import Split, StageModule

TOL = 1e-9
IDS = [spec.name for spec in SPECS]


def sizes(spec: ScheduleSpec, max_devices: int = 6, max_micro_batches: int = 12) -> Iterator[tuple[int, int, int]]:
    """(S, m, v) the spec runs: v = 1, plus its virtual choices where m suits them."""
    for S in range(1, max_devices + 1):
        for m in range(spec.least_micro_batches(S), max_micro_batches + 1):
            for v in dict.fromkeys((*_one(spec), *spec.virtual_choices)):
                if v > 1 and spec.micro_batches_multiple_of_devices and m % S:
                    continue
                yield S, m, v


def _one(spec: ScheduleSpec) -> tuple[int, ...]:
    """``(1,)`` if the schedule also runs one chunk per device (interleaved 1F1B does; zb-v,
    two chunks in a V, refuses it)."""
    try:
        spec.create_schedule(2, 2, 1)
    except ScheduleError:
        return ()
    return (1,)


def held(spec: ScheduleSpec, S: int, m: int, v: int) -> tuple[float, ...]:
    """Simulated peak micro-batches held per device: one byte from a chunk's F until its
    backward has freed it all (B, or W when the backward is split)."""
    costs = [StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=1.0, weight_grad_bytes=1.0)] * (S * v)
    t = simulate(spec.make(S, m, v), costs, devices=S, placement=spec.placement)
    return t.peak_memory_bytes


# --- the registry -------------------------------------------------------------------------------


def test_names_and_preferences_are_unique() -> None:
    assert schedule_names() == tuple(IDS) == tuple(SCHEDULES)
    assert len(set(IDS)) == len(IDS)
    assert len({spec.preference for spec in SPECS}) == len(SPECS)
    assert [spec.name for spec in search_order()] == [
        "1f1b",
        "zb-h1",
        "gpipe",
        "interleaved-1f1b",
        "zb-v",
        "v-half",
        "dualpipe-v",
        "v-min",
        "zb-h2",
    ]
    assert all(
        spec.searched for spec in search_order()
    )  # every schedule is searched (v-half, v-min, dualpipe-v since issue 12)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_each_spec_lives_beside_its_create_schedule(spec: ScheduleSpec) -> None:
    module = sys.modules[spec.create_schedule.__module__]
    assert module.SPEC is spec
    assert schedule_spec(spec.name) is spec
    assert SCHEDULES[spec.name] is spec.create_schedule


def test_unknown_name_is_one_line() -> None:
    with pytest.raises(ScheduleError) as info:
        schedule_spec("pipedream")
    assert str(info.value) == (
        "unknown schedule 'pipedream'; "
        "use one of gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-v, v-half, v-min, dualpipe-v"
    )


def test_cli_schedule_choices_come_from_the_registry() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "autopipe.cli", "plan", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "{" + ",".join(schedule_names()) + "}" in out


# --- action lists -------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_actions_validate(spec: ScheduleSpec) -> None:
    for S, m, v in sizes(spec):
        schedule = spec.create_schedule(S, m, v)
        validate(schedule, S, m, v, spec.placement)
        kinds = {a.kind for actions in schedule.values() for a in actions if a is not None}
        assert kinds == (
            {Kind.FORWARD, Kind.BACKWARD, Kind.WEIGHT} if spec.splits_backward else {Kind.FORWARD, Kind.BACKWARD}
        )
        assert make_schedule(spec.name, S, m, v) == schedule


@pytest.mark.parametrize(
    "spec", [s for s in SPECS if not s.takes_virtual], ids=[s.name for s in SPECS if not s.takes_virtual]
)
def test_single_chunk_schedules_refuse_virtual(spec: ScheduleSpec) -> None:
    with pytest.raises(ScheduleError, match="got virtual: 2"):
        spec.make(2, 4, 2)


def test_kind_is_a_str_enum_that_prints_as_its_letter() -> None:
    a = Action(1, "F", 0)  # type: ignore[arg-type]  # tables give letters
    assert a.kind is Kind.FORWARD and a.kind == "F"
    assert str(a) == "1F0" and f"{a.kind}" == "F"
    assert Action.parse("3W2") == Action(3, Kind.WEIGHT, 2)
    assert parse_schedule({0: ["0F0", "0B0"]}) == {0: [Action(0, Kind.FORWARD, 0), Action(0, Kind.BACKWARD, 0)]}


# --- in flight ----------------------------------------------------------------------------------


def _budget(spec: ScheduleSpec, S: int, m: int, v: int) -> list[float]:
    """The spec's in-flight count summed over each device's chunks."""
    k = spec.inflight(S, m, v)
    assert len(k) == S * v
    home = spec.devices_of(S, v)
    return [sum(k[j] for j in range(S * v) if home[j] == d) for d in range(S)]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_inflight_bounds_what_the_simulator_holds(spec: ScheduleSpec) -> None:
    for S, m, v in sizes(spec):
        budget = _budget(spec, S, m, v)
        for got, most in zip(held(spec, S, m, v), budget, strict=True):
            assert got <= most + TOL, (S, m, v)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_inflight_is_exact_per_stage(name: str) -> None:
    spec = schedule_spec(name)
    for S, m, _ in sizes(spec):
        costs = [StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=1.0)] * S
        t = simulate(spec.make(S, m), costs, devices=S)
        assert tuple(float(k) for k in t.peak_inflight) == spec.inflight(S, m, 1)


def test_zb_h1_inflight_is_exact_per_device() -> None:
    """F to W held, ZB-H1 rank s keeps S-s activations plus s weight-grad inputs: min(m, S)."""
    spec = schedule_spec("zb-h1")
    for S, m, _ in sizes(spec):
        assert held(spec, S, m, 1) == pytest.approx(_budget(spec, S, m, 1))


def test_interleaved_inflight_is_exact_per_device() -> None:
    """Rank r holds its w_r warm-up forwards and one more before a backward frees one, at most
    all v*m; with m == S every rank runs every forward first (v*m), more than 2(S-r-1) +
    (v-1)S + 1 on its later ranks (what the budget said before; the planner's simulated check
    caught plans that did not fit)."""
    spec = schedule_spec("interleaved-1f1b")
    for S in range(1, 7):  # (every S <= 8, m <= 32 checked once: the same)
        for m in (S, 2 * S, 3 * S):
            for v in (2, 3, 4):
                assert held(spec, S, m, v) == pytest.approx(_budget(spec, S, m, v)), (S, m, v)
    assert _budget(spec, 3, 3, 2) == [6.0, 6.0, 6.0]  # was [7, 5, 3]: ranks 1 and 2 under


# --- bubble -------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_textbook_bubble_is_the_simulated_one(spec: ScheduleSpec) -> None:
    """Equal stage times (chunks 1/v of a stage); split backward: F = B = W, and m >= S
    (fewer micro-batches leave too few Ws to fill the tail, zb_h1.py)."""
    for S, m, v in sizes(spec):
        if spec.splits_backward and m < S:
            continue
        f = 1.0 / v
        costs = [StageCost(f, 2 * f, f, f, activation_bytes=1.0)] * (S * v)
        t = simulate(spec.make(S, m, v), costs, devices=S, placement=spec.placement)
        assert t.bubble_fraction == pytest.approx(spec.bubble(S, m, v), abs=TOL), (S, m, v)


# --- placement ----------------------------------------------------------------------------------


def _plan(spec: ScheduleSpec, S: int, m: int, v: int, ranks: tuple[int, ...]) -> Plan:
    """The fields of a Plan that say where its stages run (the rest plays no part here)."""
    stages = tuple(SimpleNamespace(index=j, rank=r) for j, r in enumerate(ranks))
    plan = SimpleNamespace(schedule=spec.name, devices=S, virtual=v, micro_batches=m, stages=stages)
    return cast(Plan, plan)


def _split(ranks: tuple[int, ...]) -> Split:
    """A chain of stages placed on ``ranks`` (modules empty: routing reads the wiring only)."""
    n = len(ranks)
    empty = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    stages = tuple(
        StageModule(
            index=j,
            rank=r,
            module=empty,
            inputs=("x",),
            outputs=("y",),
            sources=(j - 1 if j else -1,),
            sends=((j + 1,) if j + 1 < n else (-2,),),
            params=(),
        )
        for j, r in enumerate(ranks)
    )
    return Split(stages, ("x",), ("y",), False, ())


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_spec_simulator_and_routing_place_chunks_alike(spec: ScheduleSpec) -> None:
    for S, m, v in sizes(spec, 4, 8):
        home = spec.devices_of(S, v)
        schedule = spec.make(S, m, v)
        assert all(home[a.stage] == r for r, acts in schedule.items() for a in acts if a is not None)
        costs = [StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=1.0)] * (S * v)
        t = simulate(schedule, costs, devices=S, placement=spec.placement)
        assert all(home[at.action.stage] == at.rank for at in t.actions)
        assert compile_schedule(schedule, S, v, spec.placement).home == home
        routing = make_routing(_split(home), S, m)
        assert tuple(routing.rank_of(j) for j in range(S * v)) == home
        assert plan_schedule(_plan(spec, S, m, v, home)) == schedule


def test_a_plan_that_places_a_stage_elsewhere_is_refused() -> None:
    spec = schedule_spec("interleaved-1f1b")
    with pytest.raises(
        PlanError, match="stage 1 of the plan is on device 0, but the interleaved-1f1b schedule runs it on device 1"
    ):
        plan_schedule(_plan(spec, 2, 2, 2, (0, 0, 1, 1)))


def _v_shape(chunk: int, devices: int, virtual: int) -> int:
    """Chunk j and chunk 2S-1-j on one device (the V-shaped schedules' placement)."""
    return chunk if chunk < devices else 2 * devices - 1 - chunk


def test_a_placement_other_than_round_robin_reaches_validate_and_simulator() -> None:
    # S=2, v=2, V-shaped: chunks 0 and 3 on device 0, chunks 1 and 2 on device 1; one micro-batch.
    schedule = parse_schedule({0: ["0F0", "3F0", "3B0", "0B0"], 1: ["1F0", "2F0", "2B0", "1B0"]})
    validate(schedule, 2, 1, 2, _v_shape)
    with pytest.raises(ScheduleError, match="belongs on rank"):
        validate(schedule, 2, 1, 2, round_robin)
    costs = [StageCost(1.0, 1.0, 1.0, 1.0, activation_bytes=1.0, static_bytes=float(10**j)) for j in range(4)]
    comm = [0.5, 0.5, 0.5]  # 1 -> 2 is on one device: free
    t = simulate(schedule, costs, comm, devices=2, placement=_v_shape)
    # F: 0 [0,1], hop, 1 [1.5,2.5], 2 [2.5,3.5], hop, 3 [4,5]; B back the same way: 3 [5,6],
    # hop, 2 [6.5,7.5], 1 [7.5,8.5], hop, 0 [9,10].
    assert t.iteration_s == pytest.approx(10.0)
    assert t.peak_memory_bytes == pytest.approx((1 + 1000 + 2, 10 + 100 + 2))
    fast = simulate_summary(compile_schedule(schedule, 2, 2, _v_shape), costs, comm)
    assert fast.iteration_s == pytest.approx(t.iteration_s)
    assert fast.peak_memory_bytes == pytest.approx(t.peak_memory_bytes)
