"""DualPipeV (autopipe/schedules/v_shapes/dualpipe_v.py): the lists against torch's ScheduleDualPipeV,
validator-clean grids, the simulated makespan against the ramp bound, in-flight memory against
the simulator, the overlapped pairs, the least m, the S=4 picture."""

from __future__ import annotations

import types
from functools import cache
from typing import Any

import pytest
from torch.distributed.pipelining.schedules import ScheduleDualPipeV

from autopipe.errors import ScheduleError
from autopipe.planner.request import SEARCH_SCHEDULES
from autopipe.schedules import schedule_names, schedule_spec, validate
from autopipe.schedules.action import IDLE, Action, Kind, v_shape
from autopipe.schedules.v_shapes import dualpipe_v, zb_v
from autopipe.simulate.events import StageCost, Timeline, simulate
from autopipe.simulate.replay import replay

UNIT = StageCost(
    forward_s=1.0, backward_s=2.0, backward_input_s=1.0, backward_weight_s=1.0, activation_bytes=1.0
)  # one chunk: F = B = W, activations 1 per micro-batch
SIZES = [(S, m) for S in range(1, 9) for m in range(2 * S, 33)]


@cache  # replay: simulate()'s Timeline number for number (tests/simulate/test_replay.py), fast
def run(devices: int, micro_batches: int) -> Timeline:
    schedule = dualpipe_v.create_schedule(devices, micro_batches)
    return replay(schedule, [UNIT] * (2 * devices), devices=devices, virtual=2, placement=v_shape)


def _ours(a: Any) -> list[str]:
    """One torch action in autopipe's kinds: I (input-grad) -> B; a full backward -> B then W."""
    kind, s, i = str(a.computation_type), a.stage_index, a.microbatch_index
    if kind.endswith("FULL_BACKWARD"):
        return [f"{s}B{i}", f"{s}W{i}"]
    letter = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W"}[kind.split(".")[-1]]
    return [f"{s}{letter}{i}"]


def torch_lists(devices: int, micro_batches: int) -> dict[int, tuple[list[str], list[str]]]:
    """torch's own DualPipeV lists (its list builder reads only these two fields) in autopipe's
    kinds, an OVERLAP_F_B action as its F and B; and, per rank, the overlapped pairs "F&B"."""
    ns = types.SimpleNamespace(pp_group_size=devices, _n_microbatches=micro_batches)
    out = {}
    for rank in range(devices):
        flat: list[str] = []
        pairs: list[str] = []
        for a in ScheduleDualPipeV._calculate_single_rank_operations(ns, rank):  # type: ignore[arg-type]
            subs = a.sub_actions or (a,)
            if a.sub_actions:
                f, b = a.sub_actions
                pairs.append(f"{_ours(f)[0]}&{_ours(b)[0]}")
            for sub in subs:
                flat.extend(_ours(sub))
        out[rank] = (flat, pairs)
    return out


@pytest.mark.parametrize("devices", range(1, 9))
def test_lists_are_torchs(devices: int) -> None:
    # The reference: torch 2.13's ScheduleDualPipeV, "based on the open sourced code from
    # deepseek-ai/DualPipe". Same actions in the same order on every rank, same pairs.
    for m in range(2 * devices, 33):
        for rank, (flat, pairs) in torch_lists(devices, m).items():
            assert [str(a) for a in dualpipe_v.rank_actions(rank, devices, m)] == flat
            ours = dualpipe_v.overlapped(rank, devices, m)
            assert [f"{f}&{b}" for f, b in ours] == pairs


@pytest.mark.parametrize("devices", range(1, 9))
def test_validator_clean(devices: int) -> None:
    for m in range(2 * devices, 33):
        schedule = dualpipe_v.create_schedule(devices, m)
        validate(schedule, devices, m, 2, v_shape)
        for d, actions in schedule.items():
            assert {a.stage for a in actions if a is not None} == {d, 2 * devices - 1 - d}
        assert sum(len(actions) for actions in schedule.values()) == 3 * 2 * devices * m


def test_pairs_are_adjacent_f_then_b_of_the_other_chunk() -> None:
    for S, m in SIZES:
        for d in range(S):
            actions = dualpipe_v.rank_actions(d, S, m)
            pairs = dualpipe_v.overlapped(d, S, m)
            # every steady-state step but the turn's first is a pair: 2 per micro-batch past 2S-1-d
            assert len(pairs) == 2 * (m - 2 * S + d + 1) + (S - d - 1) - (d == S - 1)
            where = {a: i for i, a in enumerate(actions)}
            for f, b in pairs:
                at = where[f]
                assert actions[at + 1] == b and f.kind is Kind.FORWARD and b.kind is Kind.BACKWARD
                assert {f.stage, b.stage} == {d, 2 * S - 1 - d}  # the other chunk of the device
                assert actions[at + 2] == Action(b.stage, Kind.WEIGHT, b.microbatch)  # full B


def test_makespan_is_the_ramp_bound() -> None:
    # 6m units of work per device plus the S-1 forwards before the last device can start: no
    # schedule on the V does better; DualPipeV reaches it for every m >= 2S (pairs priced F+B).
    for S, m in SIZES:
        timeline = run(S, m)
        assert timeline.iteration_s == dualpipe_v.makespan_units(S, m) == 6 * m + S - 1
        assert abs(timeline.bubble_fraction - dualpipe_v.bubble(S, m)) < 1e-9
        assert dualpipe_v.bubble(S, m) == pytest.approx(zb_v.bubble(S, m))
    # and simulate() itself (what replay stands for above), at a few sizes
    for S, m in ((1, 2), (3, 7), (4, 9)):
        timeline = simulate(dualpipe_v.create_schedule(S, m), [UNIT] * (2 * S), devices=S, placement=v_shape)
        assert timeline.iteration_s == 6 * m + S - 1 and timeline == run(S, m)


def test_inflight_is_what_the_simulator_counts() -> None:
    for S, m in SIZES:
        counted = run(S, m).peak_inflight
        assert tuple(float(c) for c in counted) == dualpipe_v.inflight(S, m, 2)
        assert max(counted) <= dualpipe_v.inflight(S, m, 2)[0]


def test_peak_memory_is_2s_plus_1_chunks() -> None:
    # Both chunks of a device peak together: 2S+1 chunk activations (DeepSeek's "PP+1" for
    # PP = 2S stages), one more than ZB-V's 2S.
    for S, m in SIZES:
        assert run(S, m).peak_memory_bytes == (2.0 * S + 1,) * S


# S=4, m=10, every F, B (input-grad), W one unit: what each device starts in time slots
# 0..19 ("-" idle). What was compared with DeepSeek's DualPipeV figure (README of
# deepseek-ai/DualPipe: 4 PP ranks, 8 stages, 10 micro-batches) — its structure, as the
# figure draws it and dualpipev.py builds it, not pixel timing: device 0 opens with 2(S-1) = 6
# forwards of chunk 0 and then 0F6 7F0; device 3 (the turn) alternates chunks 3 and 4,
# which need no hop, and its first 3F4/4B0 is not overlapped; pairs F(a)&B(b), F(b)&B(a)
# (with the B's W right after) fill the steady state; each device idles S-1 = 3 slots in
# all, device d d of them in the ramp and the rest in the drain. The timed slots differ from
# the figure where it draws a pair as one F&B cell shorter than F+B (see the pricing rule).
FIGURE_S4 = {
    0: "0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7B0 7W0 7F1 7B1 7W1 7F2 7B2 7W2 7F3 0F7 7B3 7W3",
    1: "-   1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6B0 6W0 6F2 6B1 6W1 6F3 1F6 6B2 6W2 6F4 1B0",
    2: "-   -   2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5B0 5W0 5F3 2F5 5B1 5W1 5F4 2B0 2W0 2F6",
    3: "-   -   -   3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 4W0 4F4 3B0 3W0 3F5 4B1 4W1",
}


def test_s4_grid_matches_the_figure() -> None:
    timeline = run(4, 10)
    slots = {d: [IDLE] * 20 for d in range(4)}
    for t in timeline.actions:
        if t.start_s < 20:
            slots[t.rank][int(t.start_s)] = str(t.action)
    grid = {d: " ".join(cells) for d, cells in slots.items()}
    print("\n".join(f"device {d} | {row}" for d, row in grid.items()))
    assert grid == {d: " ".join(row.split()) for d, row in FIGURE_S4.items()}


def test_too_few_micro_batches_is_one_line() -> None:
    with pytest.raises(ScheduleError) as info:
        dualpipe_v.create_schedule(4, 7)
    assert str(info.value) == (
        "dualpipe-v needs at least 2 x devices = 8 micro-batches on 4 devices (got 7); use micro_batches >= 8"
    )
    assert dualpipe_v.least_micro_batches(4) == dualpipe_v.SPEC.least_micro_batches(4) == 8


def test_rejects_other_virtual() -> None:
    with pytest.raises(ScheduleError) as info:
        dualpipe_v.create_schedule(4, 8, 3)
    assert str(info.value) == ("dualpipe-v runs two chunks per device in a V (got virtual: 3); use virtual=2")


def test_registered_and_searched() -> None:
    assert "dualpipe-v" in schedule_names()
    spec = schedule_spec("dualpipe-v")
    assert spec is dualpipe_v.SPEC and spec.searched and spec.splits_backward
    assert spec.torch_class == "ScheduleDualPipeV" and spec.devices_of(2, 2) == (0, 1, 1, 0)
    assert "dualpipe-v" in SEARCH_SCHEDULES
    assert len({s.preference for s in map(schedule_spec, schedule_names())}) == len(schedule_names())
