"""V-Half and V-Min (autopipe/schedules/v_shapes/v_half.py, v_min.py, built by v_block.py): V placement,
validator-clean lists, memory against the simulator and the paper's table, the makespan
formulas against the simulator, the S=4 grids, the tiled lists against the full build, the C
builder (_vbuild.c) against the Python steps (both paths: the ``native_and_python`` fixture).

What the S=4 grids are compared with: the authors' generator of these two schedules,
``zbv_greedy.py`` in sail-sg/zero-bubble-pipeline-parallelism (``PipelineGraph(p, m, "half" |
"min", ...)``: ``stable_pattern_v_half`` / ``stable_pattern_v_min``, ``schedule_from_pattern``:
repeat, reorder with Ws, reorder without, Ws put back, each device's passes in slot order).
That code was read, not run or copied (offline, and its code stays out of this repository):
v_block.py follows its steps, and the grids below are its output for ``p=4``, ``m=8`` as
autopipe's simulator times them with F = B = W = 1 and free links (the authors' own
``eager_execution_time`` with those costs gives the same start times: same per-device order,
same dependencies). A second, separate reading of those steps written while building this
(slot lists in plain Python, no numpy) gave the same lists for every S <= 8 at
m = 2S, 2S+1, 2S+5, 3S+2. The paper's table: activation memory per device ``(p+2)//2``
(V-Half) and ``(p+4)//3`` (V-Min) micro-batches of a stage, bubble about ``p/(2m)`` and
``2p/(3m)`` passes: test_peak_memory_is_the_papers_table and the makespan formulas.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType

import numpy as np
import pytest

from autopipe import native
from autopipe.errors import ScheduleError
from autopipe.planner.request import SEARCH_SCHEDULES
from autopipe.schedules import one_f_one_b, schedule_names, schedule_spec
from autopipe.schedules.action import IDLE, v_shape
from autopipe.schedules.lists import from_schedule
from autopipe.schedules.v_shapes import v_block, v_half, v_min, zb_v
from autopipe.simulate.events import StageCost, Timeline, simulate

MODULES = {"v-half": v_half, "v-min": v_min}
NAMES = list(MODULES)
# one chunk, F = B = W = 1; weight_grad_bytes = activation_bytes: held from F to W
UNIT = StageCost(1.0, 2.0, 1.0, 1.0, activation_bytes=1.0, weight_grad_bytes=1.0)
PAPER = {"v-min": lambda S: (S + 4) // 3, "v-half": lambda S: (S + 2) // 2}  # micro-batches of a stage


@cache  # several tests read the same timelines; simulate() validates each
def run(name: str, devices: int, micro_batches: int) -> Timeline:
    schedule = MODULES[name].create_schedule(devices, micro_batches)
    return simulate(schedule, [UNIT] * (2 * devices), devices=devices, placement=v_shape)


def check(name: str, S: int, m: int) -> None:
    """Validator-clean (simulate() validates), V-placed, complete; the makespan and bubble
    formulas are the simulated ones; memory: the paper's per device, and the per-chunk
    counts bound what the simulator holds."""
    module: ModuleType = MODULES[name]
    timeline = run(name, S, m)
    schedule = module.create_schedule(S, m)
    for d, actions in schedule.items():
        assert {a.stage for a in actions if a is not None} == {d, 2 * S - 1 - d}
    assert sum(len(actions) for actions in schedule.values()) == 3 * 2 * S * m
    assert abs(timeline.iteration_s - module.makespan_units(S, m)) < 1e-9, (S, m)
    assert abs(timeline.bubble_fraction - module.bubble(S, m)) < 1e-9, (S, m)
    assert timeline.iteration_s >= 6 * m + S - 1  # never below the ramp bound (zb_v.py)
    lists = module.create_lists(S, m)
    assert tuple(timeline.peak_memory_bytes) == v_block.device_peak(lists)
    if S > 1:
        assert max(timeline.peak_memory_bytes) == 2 * PAPER[name](S), (S, m)
    k = module.inflight(S, m, 2)  # the two chunks of a device: its most held, F to W
    assert [k[d] + k[2 * S - 1 - d] for d in range(S)] == list(timeline.peak_memory_bytes)


@pytest.mark.parametrize("name", NAMES)
def test_some_sizes(name: str) -> None:
    assert MODULES[name].SPEC.devices_of(4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    for S in range(1, 9):
        for m in (2 * S, 2 * S + 3) if S <= 4 else (2 * S + 1,):
            check(name, S, m)


@pytest.mark.slow  # ~300 simulations, ~15 s on a loaded 2-core machine
@pytest.mark.parametrize("name", NAMES)
def test_every_size_up_to_8_devices_and_32_micro_batches(name: str) -> None:
    for S in range(1, 9):
        for m in range(2 * S, 33):
            check(name, S, m)


def test_bubbles_rank_v_min_over_v_half_over_zb_v() -> None:
    # More memory, less bubble: V-Min >= V-Half >= ZB-V's ramp, and V-Min below 1F1B's 6(S-1).
    for S in range(2, 9):
        m = 4 * S
        vmin, vhalf = v_min.makespan_units(S, m) - 6 * m, v_half.makespan_units(S, m) - 6 * m
        assert 6 * (S - 1) > vmin >= vhalf >= zb_v.makespan_units(S, m) - 6 * m == S - 1
    assert (v_min.makespan_units(8, 32) - 192, v_half.makespan_units(8, 32) - 192) == (27, 17)
    # the paper's rates: V-Half about S/(2m) of the work 6m, V-Min about 2S/(3m)
    assert v_half.makespan_units(64, 512) - 6 * 512 == 3 * 64 - 7
    assert v_min.makespan_units(64, 512) - 6 * 512 == 4 * 64 - 5


@pytest.mark.parametrize("name", NAMES)
def test_peak_memory_is_the_papers_table(name: str) -> None:
    """A chunk is half a stage: 1F1B's peak is S stage activations, 2S chunk activations."""
    stage = StageCost(2.0, 4.0, 2.0, 2.0, activation_bytes=2.0)
    for S in (4, 8):
        ofob = max(simulate(one_f_one_b.create_schedule(S, 32), [stage] * S).peak_memory_bytes)
        assert ofob == 2 * S
    # The ratios of the paper's title, growing S: V-Min about 1/3, V-Half about 1/2 of 1F1B.
    assert [PAPER["v-min"](S) / S for S in (8, 32, 128)] == pytest.approx([1 / 2, 12 / 32, 44 / 128])
    assert [PAPER["v-half"](S) / S for S in (8, 32, 128)] == pytest.approx([5 / 8, 17 / 32, 65 / 128])
    assert max(run("v-min", 8, 32).peak_memory_bytes) / 16 == 1 / 2  # 8 of 1F1B's 16
    assert max(run("v-half", 8, 32).peak_memory_bytes) / 16 == 5 / 8  # 10 of 16


def test_building_blocks_are_the_papers() -> None:
    # Per device: micro-batch 0's slots of F down, F up, B up, B down; no two in one slot mod 6.
    assert v_half.pattern(4) == ((0, 10, 14, 25), (2, 9, 16, 24), (4, 8, 18, 23), (6, 7, 20, 22))
    assert v_min.pattern(4) == ((0, 7, 8, 15), (1, 6, 9, 14), (2, 5, 10, 13), (3, 4, 11, 12))
    for module in MODULES.values():
        for S in range(1, 17):
            assert all(len({s % 6 for s in slots}) == 4 for slots in module.pattern(S))


# S=4, m=8, every slot ("-" idle), as the simulator times them: the authors' generator's output.
FIGURES = {
    "v-half": {
        0: "0F0 0F1 0F2 0F3 0F4 -   -   7F0 7B0 7W0 7F1 7B1 7W1 7F2 -   -   0B0 7B2 7W2 7F3 0W0 0F5 0B1 7B3 7W3 7F4 0W1 0F6 0B2 7B4 7W4 7F5 0W2 0F7 0B3 7B5 7W5 7F6 7B6 7W6 0B4 0W3 0W4 7F7 7B7 0B5 7W7 0B6 0W5 0W6 -   0B7 0W7",  # noqa: E501
        1: "-   1F0 1F1 1F2 1F3 -   6F0 -   6F1 6B0 6W0 6F2 6B1 6W1 -   1B0 1W0 1F4 6F3 6B2 6W2 1B1 1W1 1F5 6F4 6B3 6W3 1B2 1W2 1F6 6F5 6B4 6W4 1B3 1F7 1W3 6F6 6B5 6W5 1B4 6B6 6W6 6F7 1W4 1B5 6B7 1B6 6W7 1W5 1W6 1B7 1W7 -",  # noqa: E501
        2: "-   -   2F0 2F1 2F2 5F0 -   5F1 -   5F2 5B0 5W0 2F3 5B1 2B0 5W1 2W0 5F3 2F4 -   2B1 5B2 5W2 5F4 2W1 2F5 2B2 5B3 5W3 5F5 2W2 2F6 2B3 5B4 5W4 5F6 2W3 2F7 2B4 5B5 5W5 5F7 5B6 2B5 5W6 2B6 5B7 5W7 2W4 2B7 2W5 2W6 2W7",  # noqa: E501
        3: "-   -   -   3F0 4F0 3F1 4F1 3F2 4F2 -   -   4B0 4W0 3B0 3W0 3F3 4F3 4B1 4W1 3B1 3W1 3F4 4F4 4B2 4W2 3B2 3W2 3F5 4F5 4B3 4W3 3B3 3F6 3W3 4F6 4B4 3B4 4W4 3F7 3W4 4F7 4B5 3B5 4B6 3B6 4W5 4W6 4B7 3B7 4W7 3W5 3W6 3W7",  # noqa: E501
    },
    "v-min": {
        0: "0F0 0F1 0F2 -   -   -   -   7F0 7B0 7W0 7F1 7B1 7W1 -   -   0B0 0W0 0F3 -   7F2 7B2 0B1 7W2 0W1 0F4 7F3 7B3 0B2 7W3 0W2 0F5 7F4 7B4 0B3 7W4 0W3 0F6 7F5 7B5 0B4 7W5 0W4 0F7 7F6 7B6 0B5 7W6 0W5 -   7F7 7B7 0B6 7W7 0W6 -   -   -   0B7 0W7",  # noqa: E501
        1: "-   1F0 1F1 -   -   -   6F0 -   6F1 6B0 6W0 1F2 -   -   1B0 6B1 6W1 1W0 6F2 1F3 1B1 6B2 6W2 1W1 6F3 1F4 1B2 6B3 6W3 1W2 6F4 1F5 1B3 6B4 6W4 1W3 6F5 1F6 1B4 6B5 6W5 1W4 6F6 1F7 1B5 6B6 6W6 1W5 6F7 -   1B6 6B7 6W7 1W6 -   -   1B7 1W7 -",  # noqa: E501
        2: "-   -   2F0 2F1 -   5F0 -   5F1 -   -   5B0 5W0 2F2 2B0 2W0 -   5B1 5F2 5W1 2B1 2F3 2W1 5B2 5F3 5W2 2B2 2F4 2W2 5B3 5F4 5W3 2B3 2F5 2W3 5B4 5F5 5W4 2B4 2F6 2W4 5B5 5F6 5W5 2B5 2F7 2W5 5B6 5F7 5W6 2B6 2W6 -   5B7 5W7 -   2B7 2W7 -   -",  # noqa: E501
        3: "-   -   -   3F0 4F0 3F1 4F1 -   -   -   -   4B0 3B0 4W0 3W0 3F2 4F2 4B1 3B1 4W1 3W1 3F3 4F3 4B2 3B2 4W2 3W2 3F4 4F4 4B3 3B3 4W3 3W3 3F5 4F5 4B4 3B4 4W4 3W4 3F6 4F6 4B5 3B5 4W5 3W5 3F7 4F7 4B6 3B6 4W6 3W6 -   -   4B7 3B7 4W7 3W7 -   -",  # noqa: E501
    },
}


def _grid(name: str, S: int, m: int) -> dict[int, str]:
    timeline = run(name, S, m)
    cells = {d: [IDLE] * int(timeline.iteration_s) for d in range(S)}
    for t in timeline.actions:
        cells[t.rank][int(t.start_s)] = str(t.action)
    return {d: " ".join(row) for d, row in cells.items()}


@pytest.mark.parametrize("name", NAMES)
def test_s4_grid_is_the_authors(name: str) -> None:
    grid = _grid(name, 4, 8)
    print(f"\n{name}, S=4, m=8:\n" + "\n".join(f"device {d} | {row}" for d, row in grid.items()))
    assert grid == {d: " ".join(row.split()) for d, row in FIGURES[name].items()}
    # In steady state (slots 21..31) every device is busy and repeats
    # the building block's 6 passes every 6 slots.
    timings = run(name, 4, 8).actions
    for d in range(4):
        mine = sorted((t.start_s, t.action) for t in timings if t.rank == d)
        steady = [(s, a) for s, a in mine if 21 <= s < 32]
        assert [s for s, _ in steady] == [float(s) for s in range(21, 32)]
        for (s, a), (s6, a6) in zip(steady, steady[6:], strict=False):
            assert (s6 - s, a6.stage, a6.kind, a6.microbatch) == (6.0, a.stage, a.kind, a.microbatch + 1)


@pytest.mark.parametrize("name", NAMES)
def test_tiled_lists_are_the_full_build(name: str, native_and_python: str) -> None:
    """create_lists tiles the steady state into the m = 2S lists; running every step for m
    gives the same lists (S up to 12 here; up to 64 checked while building it)."""
    module = MODULES[name]
    for S, m in ((1, 5), (2, 7), (3, 6), (3, 11), (5, 17), (8, 17), (8, 29), (12, 31)):
        built = v_block.build(module.pattern(S), m)
        tiled = module.create_lists(S, m)
        assert all(np.array_equal(a, b) for a, b in zip(built, tiled, strict=True)), (S, m)
    spec = schedule_spec(name)
    assert spec.create_lists is module.create_lists
    got, want = spec.lists(4, 9, 2), from_schedule(module.create_schedule(4, 9), 4)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_c_build_is_the_python_build(native_and_python: str) -> None:
    """v_block.build on the path under test (the C builder, _vbuild.c, or the Python steps) and
    with the Python steps give the same lists, both patterns, every S <= 12 at a few m in
    [2S, 2S+3], and S = 16, 24 once; the C builder refuses a bad pattern in one line."""
    cases = [(S, m) for S in range(1, 13) for m in sorted({2 * S, 2 * S + 1 + S % 3})] + [(16, 33), (24, 48)]
    for module in MODULES.values():
        for S, m in cases:
            here = v_block.build(module.pattern(S), m)
            if native_and_python == "python":
                in_python = here  # the Python steps already (20-40x slower: not run twice)
            else:
                with native.python_twins():
                    in_python = v_block.build(module.pattern(S), m)
            assert len(here) == len(in_python) == S
            assert all(np.array_equal(a, b) for a, b in zip(here, in_python, strict=True)), (module.__name__, S, m)
    if native_and_python == "native":
        with pytest.raises(ValueError, match=r"^_vbuild\.build: a pattern slot out of range$"):
            v_block._in_c(np.array([[-1, 0, 1, 2]]), 2)
    else:
        assert v_block._in_c(np.array([[0, 1, 2, 3]]), 2) is None  # switched off: the Python steps run


@pytest.mark.parametrize("name", NAMES)
def test_inflight_is_read_off_the_lists(name: str) -> None:
    """inflight reads the 2S+1 lists for every larger m (the tiled periods repeat the counts):
    the same as reading each m's own lists."""
    module = MODULES[name]
    for S in (1, 2, 3, 5, 8):
        for m in (2 * S, 2 * S + 1, 3 * S + 1, 4 * S + 3, 9 * S):
            assert module.inflight(S, m) == v_block.inflight(module.create_lists(S, m), S), (S, m)


def test_inflight_is_a_per_chunk_recount() -> None:
    """inflight (one count per device, chunks read off at its first most) against counting each
    chunk on its own and reading all of them where their sum first peaks."""
    for module in MODULES.values():
        for S, m in ((1, 3), (3, 7), (6, 13)):
            lists = module.create_lists(S, m)
            want = [0.0] * (2 * S)
            for rows in lists:
                chunks = sorted(set(rows[:, 0].tolist()))
                counts = [
                    np.cumsum((rows[:, 0] == c) & (rows[:, 1] == 0)) - np.cumsum((rows[:, 0] == c) & (rows[:, 1] == 2))
                    for c in chunks
                ]
                at = int(np.argmax(np.sum(counts, axis=0)))
                for c, count in zip(chunks, counts, strict=True):
                    want[c] = float(count[at])
            assert v_block.inflight(lists, S) == tuple(want), (module.__name__, S, m)


def _peak_recounted(code: np.ndarray) -> int:
    """Most activations held, Ws in the free slots oldest first, counted slot by slot."""
    held = pending = most = 0
    for c in code.tolist():
        if c in (0, 1):
            held += 1
        elif c in (2, 3):
            pending += 1
        elif pending:
            pending, held = pending - 1, held - 1
        most = max(most, held)
    return most


def _ws_recounted(dev: list[list[int]], split: bool) -> list[list[int]]:
    """Each B's W in the first free slot with a B waiting (up-leg first when split), slot by slot."""
    kind = {s: t for t, lst in enumerate(dev) for s in lst}
    pending, ws = [0, 0], [[], []]  # type: ignore[var-annotated]
    last = max(kind)
    for i in range(last + 1):
        t = kind.get(i)
        if t is not None:
            pending[t - 2 if split else 0] += t >= 2
        elif pending[0] or pending[1]:
            w = 0 if pending[0] else 1
            ws[w].append(i)
            pending[w] -= 1
    ws[0] += range(last + 1, last + 1 + pending[0])
    ws[1] += range(last + 1 + pending[0], last + 1 + pending[0] + pending[1])
    return [*dev, *ws] if split else [*dev, ws[0]]


def test_reorder_counts_are_recounts() -> None:
    """The reorder's shortcuts, on random slot codes: whether a move keeps the implicit-W peak
    (and the counts it updates in place) as a full recount says; the Ws put back as a slot by
    slot walk puts them."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        code = rng.choice([-1, -1, 0, 1, 2, 3], size=int(rng.integers(4, 40)))
        state = v_block._implicit(code)
        most = _peak_recounted(code)
        assert max(state[0]) == most
        s = int(rng.choice(np.flatnonzero(code >= 0)))
        for p in np.flatnonzero(code[:s] == -1).tolist():
            moved = code.copy()
            moved[p], moved[s] = code[s], -1
            assert v_block._fits(state, int(code[s]), p, s, most) == (_peak_recounted(moved) <= most)
            again = (list(state[0]), list(state[1]), list(state[2]))
            v_block._move(again, int(code[s]), p, s)
            assert again == v_block._implicit(moved)
        dev = [np.flatnonzero(code == t).tolist() for t in range(4)]
        if any(dev):
            for split in (False, True):
                assert v_block._with_w(dev, split) == _ws_recounted(dev, split)


@pytest.mark.parametrize("name", NAMES)
def test_rejects_bad_sizes_in_one_line(name: str) -> None:
    module = MODULES[name]
    with pytest.raises(ScheduleError) as info:
        module.create_schedule(4, 8, 3)
    assert str(info.value) == f"{name} runs two chunks per device in a V (got virtual: 3); use virtual=2"
    with pytest.raises(ScheduleError) as info:
        module.create_lists(4, 7)
    assert (
        str(info.value)
        == f"{name} needs at least 2 x devices = 8 micro-batches on 4 devices (got 7); use micro_batches >= 8"
    )
    with pytest.raises(ScheduleError, match=r"^micro_batches must be a positive integer \(got 0\)$"):
        module.create_schedule(4, 0)
    assert schedule_spec(name).least_micro_batches(4) == 8


@pytest.mark.parametrize("name", NAMES)
def test_registered_searched_no_torch_class(name: str) -> None:
    spec = schedule_spec(name)
    assert name in schedule_names() and spec is MODULES[name].SPEC
    assert spec.searched and name in SEARCH_SCHEDULES
    assert spec.torch_class == "" and spec.splits_backward and spec.virtual_choices == (2,)
