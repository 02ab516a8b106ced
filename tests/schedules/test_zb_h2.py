"""ZB-H2 (autopipe/schedules/zb_h2.py): validator-clean lists, the makespan against the ramp
bound, in-flight memory exact in the simulator, the S=3 grid of the docstring.

What the grid is compared with: the ZB-H2 figure of Qi et al. (ICLR 2024, section 3) shows,
for F = B = W, a parallelogram: more forwards in the warm-up than 1F1B (rank s of S runs
until it holds 2S-1 micro-batches or meets its first B), then B, W and F in turn with no idle
slot until the last rank's work is done. The grid below has that shape; the test checks the
properties that define it (no rank idles between its first and its last action once
m >= 2S-1; each rank's peak is 2S-1; the iteration is only the ramp above the work once
m >= S).
"""

from __future__ import annotations

from functools import cache

import pytest

from autopipe.errors import ScheduleError
from autopipe.schedules import schedule_spec, zb_h1, zb_h2
from autopipe.schedules.action import IDLE
from autopipe.simulate.events import StageCost, Timeline, simulate

UNIT = StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=1.0, weight_grad_bytes=1.0)  # F to W


@cache
def run(devices: int, micro_batches: int) -> Timeline:
    return simulate(zb_h2.create_schedule(devices, micro_batches), [UNIT] * devices, devices=devices)


def check(S: int, m: int) -> None:
    timeline = run(S, m)  # simulate() validates the lists first
    assert abs(timeline.iteration_s - zb_h2.makespan_units(S, m)) < 1e-9, (S, m)
    assert abs(timeline.bubble_fraction - zb_h2.bubble(S, m)) < 1e-9, (S, m)
    assert timeline.iteration_s >= 3 * m + S - 1  # no schedule beats the ramp
    assert timeline.peak_memory_bytes == zb_h2.inflight(S, m) == (float(min(m, 2 * S - 1)),) * S
    if m >= 2 * S - 1:  # zero bubble: every rank busy from its first action to its last
        for rank in range(S):
            mine = [t for t in timeline.actions if t.rank == rank]
            assert mine[-1].end_s - mine[0].start_s == 3 * m


def test_some_sizes() -> None:
    for S in range(1, 9):
        for m in sorted({1, 2, S, 2 * S + 1}):
            check(S, m)


@pytest.mark.slow  # 256 simulations
def test_every_size_up_to_8_devices_and_32_micro_batches() -> None:
    for S in range(1, 9):
        for m in range(1, 33):
            check(S, m)


FIGURE_S3 = {
    0: "0F0 0F1 0F2 0F3 0F4 0B0 0W0 0B1 0F5 0B2 0W1 0B3 0W2 0B4 0W3 0W4 0B5 0W5 -   -",
    1: "-   1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1W0 1B3 1F5 1B4 1W1 1W2 1B5 1W3 1W4 1W5 -",
    2: "-   -   2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2F4 2B4 2W0 2F5 2B5 2W1 2W2 2W3 2W4 2W5",
}


def test_s3_grid() -> None:
    cells = {d: [IDLE] * 20 for d in range(3)}
    for t in run(3, 6).actions:
        cells[t.rank][int(t.start_s)] = str(t.action)
    grid = {d: " ".join(row) for d, row in cells.items()}
    print("\n" + "\n".join(f"rank {d} | {row}" for d, row in grid.items()))
    assert grid == {d: " ".join(row.split()) for d, row in FIGURE_S3.items()}


def test_the_least_iteration_where_zb_h1_misses_it() -> None:
    # B = 2F = 2W: the work m(F+B+W) plus the ramp (S-1)F is the least any schedule takes.
    stage = StageCost(1.0, 3.0, 2.0, 1.0, activation_bytes=1.0)
    S, m = 8, 32
    h2 = simulate(zb_h2.create_schedule(S, m), [stage] * S, devices=S).iteration_s
    h1 = simulate(zb_h1.create_schedule(S, m), [stage] * S, devices=S).iteration_s
    assert (h2, h1) == (m * 4 + S - 1, 142.0)
    assert zb_h2.inflight(4, 32) == (7.0,) * 4  # twice 1F1B's rank 0 (4), less one


def test_one_stage_per_device_and_registered() -> None:
    with pytest.raises(ScheduleError) as info:
        zb_h2.create_schedule(4, 8, 2)
    assert str(info.value) == "zb-h2 runs one stage per device (got virtual: 2); use virtual=1"
    spec = schedule_spec("zb-h2")
    assert spec is zb_h2.SPEC and spec.searched and spec.torch_class == "" and spec.splits_backward


def rule_slot_by_slot(S: int, m: int) -> dict[int, list[str]]:
    """The rule of the module docstring as written, one slot at a time with no tiling: the
    reference the generator's tiled steady state must equal."""
    done: set[tuple[int, str, int]] = set()
    count = [{"F": 0, "B": 0, "W": 0} for _ in range(S)]
    lists: dict[int, list[str]] = {s: [] for s in range(S)}
    while any(c["W"] < m for c in count):
        started = []
        for s, c in enumerate(count):
            if c["B"] < c["F"] and (s, "F", c["B"]) in done and (s == S - 1 or (s + 1, "B", c["B"]) in done):
                kind = "B"
            elif c["F"] < m and c["F"] - c["W"] < 2 * S - 1 and (s == 0 or (s - 1, "F", c["F"]) in done):
                kind = "F"
            elif c["W"] < c["B"]:
                kind = "W"
            else:
                continue
            started.append((s, kind, c[kind]))
            lists[s].append(f"{s}{kind}{c[kind]}")
            c[kind] += 1
        done.update(started)
    return lists


def test_the_tiled_steady_state_is_the_rule() -> None:
    # create_lists runs the rule until three slots repeat with every count one higher, then
    # tiles them; sizes where it tiles once, many times, or never (m < S, m = 2S-1, ...).
    for S, m in ((1, 7), (2, 3), (3, 40), (4, 7), (5, 9), (6, 61), (8, 15), (8, 16), (11, 80)):
        mine = {d: [str(a) for a in acts] for d, acts in zb_h2.create_schedule(S, m).items()}
        assert mine == rule_slot_by_slot(S, m), (S, m)
