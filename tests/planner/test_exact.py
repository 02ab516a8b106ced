"""The search is exact under its own simulator: seeded brute force over every contiguous split,
each priced by ``price_split`` (the function ``--balance`` prices a user's split with)."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import numpy as np
import pytest

import autopipe
from autopipe.costs.activations.choices import MemoryChoice
from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.errors import InfeasibleError
from autopipe.graph.recipe import TraceRecipe
from autopipe.modes import Recompute
from autopipe.planner.defaults import default_action_overhead, default_send_overhead
from autopipe.planner.exact import split_table
from autopipe.planner.pricing import BlockTimes, Decision, fits
from autopipe.planner.request import CHOICE_FIELDS, PlanRequest, decisions
from autopipe.planner.splits import price_split, problem_of
from autopipe.plans import Plan
from autopipe.schedules import schedule_spec

MIB = 2.0**20
NO_LIMIT = 1e18  # bytes: memory "off" (plan_profile takes a finite limit)
CHUNKED = {"interleaved-1f1b": 2, "zb-v": 2, "v-half": 2, "v-min": 2, "dualpipe-v": 2}


def chain(n: int, seed: int) -> Profile:
    """A random chain: uneven F/B/W, parameters, activations and links; fixed costs per action."""
    rng = random.Random(seed)
    blocks = tuple(
        BlockCost(
            name=f"layers.{i}",
            nodes=(f"n{i}",),
            params=rng.randrange(1000, 100_000),
            param_bytes=rng.randrange(1, 50) * int(MIB),
            forward_s=Affine(rng.uniform(0, 1e-4), f),
            backward_s=Affine(rng.uniform(0, 2e-4), 2 * f),
            backward_input_s=Affine(0.0, f * w),
            backward_weight_s=Affine(0.0, f * (2 - w)),
            saved_bytes=Affine(0.0, rng.uniform(1, 20) * MIB),
        )
        for i, (f, w) in enumerate((rng.uniform(0.5, 2.0) * 1e-3, rng.uniform(0.5, 1.5)) for _ in range(n))
    )
    links = (TensorCost(f"n{i}", i, (i + 1,), Affine(0, rng.uniform(0.1, 4) * MIB)) for i in range(n - 1))
    tensors = (TensorCost("x", -1, (0,), Affine(0, 1e4)), *links)
    return Profile(
        "chain", TraceRecipe(tracer="fx", fingerprint="fp"), "cpu", "-", "float32", (1, 2), "measured", blocks, tensors
    )


def best_split(prof: Profile, req: PlanRequest, ds: list[Decision]) -> float:
    """The least simulated time of any contiguous split of any decision that fits (brute force)."""
    n, best = prof.num_blocks, math.inf
    for d in ds:
        u = req.batch_size // d.micro_batches
        p, t = problem_of(prof, req, d), BlockTimes.of(prof, u, req.action_overhead_s, send_s=req.send_overhead_s)
        k = req.devices * d.virtual
        for cuts in itertools.combinations(range(1, n), k - 1):
            edges = (0, *cuts, n)
            _, s = price_split(prof, req, d, [b - a for a, b in itertools.pairwise(edges)], problem=p, times=t)
            if fits(s, req.memory_limit):
                best = min(best, s.iteration_s)
    return best


def case(seed: int, max_blocks: int) -> tuple[Profile, dict[str, object]]:
    rng = random.Random(seed)
    name = rng.choice(["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "zb-h2", "v-half", "v-min", "dualpipe-v"])
    S = rng.randint(2, 4)
    v = CHUNKED.get(name, 1)
    n = rng.randint(S * v, max(S * v, max_blocks))
    m = S * rng.choice([1, 2]) if name == "interleaved-1f1b" else rng.choice([1, 2, S, 2 * S])
    m = max(m, schedule_spec(name).least_micro_batches(S))  # dualpipe-v: m >= 2S
    memory = rng.choice([NO_LIMIT, rng.uniform(0.3, 2.0) * 2**30])
    kw: dict[str, object] = dict(
        stages=S,
        batch_size=2 * m,
        memory=memory,
        schedule=name,
        micro_batches=m,
        recompute=rng.choice(["never", "auto"]),
    )
    return chain(n, seed), kw


def _plan_profile(prof: Profile, kw: dict[str, object]) -> Plan:
    """``autopipe.plan_profile`` with :func:`case`'s keywords, its choices among them as one value."""
    choices = autopipe.Choices(**{k: v for k, v in kw.items() if k in CHOICE_FIELDS})  # type: ignore[arg-type]
    return autopipe.plan_profile(prof, choices=choices, **{k: v for k, v in kw.items() if k not in CHOICE_FIELDS})  # type: ignore[arg-type]


def check_pinned(seed: int, max_blocks: int) -> None:
    prof, kw = case(seed, max_blocks)
    plan_kw = dict(kw)
    req = PlanRequest(
        devices=int(kw["stages"]),
        batch_size=int(kw["batch_size"]),
        memory_limit=float(kw["memory"]),  # type: ignore[call-overload]
        micro_batches=int(kw["micro_batches"]),
        schedule=str(kw["schedule"]),
        recompute=str(kw["recompute"]),  # type: ignore[call-overload]
        link_bandwidth=4e9,
        link_latency_s=120e-6,
        action_overhead_s=default_action_overhead("cpu"),
        send_overhead_s=default_send_overhead("cpu"),
    )  # plan_profile's defaults for a CPU profile
    want = best_split(prof, req, decisions(prof, req))
    try:
        got = _plan_profile(prof, plan_kw).iteration_time_s  # type: ignore[arg-type]
    except InfeasibleError:
        got = math.inf
    assert got == want or abs(got - want) <= 1e-9 * want, (seed, kw, got, want)


@pytest.mark.parametrize("chunk", range(4))
def test_pinned_search_equals_the_best_split_small(chunk: int) -> None:
    for seed in range(chunk * 40, chunk * 40 + 40):
        check_pinned(seed, max_blocks=9)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(4))  # seeds 1000-1099 in four parts: two workers share them
def test_pinned_search_equals_the_best_split_up_to_16_blocks(chunk: int) -> None:
    for seed in range(1000 + 25 * chunk, 1025 + 25 * chunk):
        check_pinned(seed, max_blocks=16)


@pytest.mark.slow
def test_unpinned_search_equals_the_best_over_its_decisions() -> None:
    for seed in range(60):
        rng = random.Random(seed)
        prof = chain(rng.randint(4, 9), seed)
        kw = dict(
            stages=rng.randint(2, 3),
            batch_size=rng.choice([2, 4, 6]),
            memory=rng.choice([NO_LIMIT, rng.uniform(0.3, 2) * 2**30]),
        )
        req = PlanRequest(
            devices=kw["stages"],
            batch_size=kw["batch_size"],
            memory_limit=kw["memory"],
            link_bandwidth=4e9,
            link_latency_s=120e-6,
            action_overhead_s=default_action_overhead("cpu"),
            send_overhead_s=default_send_overhead("cpu"),
        )
        want = best_split(prof, req, decisions(prof, req))
        try:
            got = _plan_profile(prof, kw).iteration_time_s  # type: ignore[arg-type]
        except InfeasibleError:
            got = math.inf
        assert got == want or abs(got - want) <= 1e-9 * want, (seed, kw, got, want)


@pytest.mark.parametrize(
    "name", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "zb-h2", "v-half", "v-min", "dualpipe-v"]
)
def test_bounds_are_below_and_memory_is_the_simulators(name: str) -> None:
    """Every split's bound is below its simulated time, and the splits kept are exactly those
    whose simulated peak fits (any placement: round-robin, V; recomputation never and auto)."""
    prof = chain(9, 5)
    S, v = 3, CHUNKED.get(name, 1)
    d = Decision(name, v, 6)
    t = BlockTimes.of(prof, 1, 1e-4)
    loose = PlanRequest(
        devices=S, batch_size=6, memory_limit=math.inf, micro_batches=6, schedule=name, action_overhead_s=1e-4
    )
    peaks = sorted(max(price_split(prof, loose, d, x)[1].peak_memory_bytes) for x in _splits(9, S * v))
    for recompute in ("never", "auto"):
        req = replace(loose, memory_limit=peaks[len(peaks) // 3], recompute=recompute)  # the limit bites
        p = problem_of(prof, req, d)
        every = split_table(p, t, d, S, math.inf)
        kept = split_table(p, t, d, S, req.memory_limit)
        assert every is not None and kept is not None and len(every.sizes) == math.comb(8, S * v - 1)
        assert list(every.bounds) == sorted(every.bounds)
        inside = {tuple(x) for x in kept.sizes.tolist()}
        assert 0 < len(inside) < len(every.sizes)
        for sizes, bound in zip(every.sizes.tolist(), every.bounds, strict=True):
            _, s = price_split(prof, req, d, sizes, problem=p, times=t)
            assert bound <= s.iteration_s
            assert fits(s, req.memory_limit) == (tuple(sizes) in inside), sizes
        if recompute == "never":
            assert kept.need == pytest.approx(peaks[0], rel=1e-9)  # the smallest limit any split fits
    assert schedule_spec(name).devices_of(S, v)


def _splits(n: int, k: int) -> list[list[int]]:
    return [
        [b - a for a, b in itertools.pairwise((0, *cuts, n))] for cuts in itertools.combinations(range(1, n), k - 1)
    ]


@pytest.mark.parametrize(
    "name", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "zb-h2", "v-half", "v-min", "dualpipe-v"]
)
def test_the_bound_of_a_priced_candidate_is_below_its_simulated_time(name: str) -> None:
    """The bound the search opens large decisions' candidates by (bounds.candidate_bound)."""
    from autopipe.planner.bounds import candidate_bound

    prof = chain(10, 8)
    S, v = 3, CHUNKED.get(name, 1)
    for m in (3, 6) if name == "interleaved-1f1b" else (1, 3, 6):  # interleaved: m a multiple of S
        if m < schedule_spec(name).least_micro_batches(S):  # dualpipe-v: m >= 2S
            continue
        req = PlanRequest(
            devices=S,
            batch_size=m,
            memory_limit=math.inf,
            micro_batches=m,
            schedule=name,
            action_overhead_s=1e-4,
            link_latency_s=1e-3,
        )
        for sizes in _splits(10, S * v)[::7]:
            c, s = price_split(prof, req, Decision(name, v, m), sizes)
            assert candidate_bound(prof, req, c) <= s.iteration_s * (1 + 1e-12), sizes


def test_local_moves_only_improve_a_decision_too_large_to_enumerate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the enumeration limit the chain solver's cuts are moved while the simulator says
    it gets faster: never slower than without the moves, and often the best split."""
    import autopipe.planner.exact as exact
    import autopipe.planner.moves as moves

    monkeypatch.setattr(exact, "ENUMERATE_LIMIT", 0)
    improved = 0
    for seed in range(2000, 2020):
        prof, kw = case(seed, 12)
        with_moves = _plan_profile(prof, kw)  # type: ignore[arg-type]
        monkeypatch.setattr(moves, "LOCAL_MOVES", 0)
        without = _plan_profile(prof, kw)  # type: ignore[arg-type]
        monkeypatch.setattr(moves, "LOCAL_MOVES", 64)
        assert with_moves.iteration_time_s <= without.iteration_time_s and max(with_moves.peak_memory_bytes) <= float(
            kw["memory"]
        ) * (1 + 1e-9)  # type: ignore[arg-type]
        improved += with_moves.iteration_time_s < without.iteration_time_s
    assert improved >= 3


def _layered(n: int, seed: int) -> Profile:
    """:func:`chain` whose blocks but the first and the last are layers (the block method's)."""
    prof = chain(n, seed)
    return replace(prof, blocks=tuple(replace(b, layer=0 < i < n - 1) for i, b in enumerate(prof.blocks)))


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "dualpipe-v"])
def test_the_block_methods_bounds_are_below_and_memory_is_the_simulators(name: str) -> None:
    """As above with every chunk recomputing its first layer (``partition/layers.py``)."""
    prof = _layered(9, 7)
    S, v = 3, CHUNKED.get(name, 1)
    d = Decision(name, v, 6, MemoryChoice(layers=1))
    t = BlockTimes.of(prof, 1, 1e-4)
    loose = PlanRequest(
        devices=S,
        batch_size=6,
        memory_limit=math.inf,
        micro_batches=6,
        schedule=name,
        action_overhead_s=1e-4,
        recompute=Recompute.NEVER,
        recompute_layers=1,
    )
    peaks = sorted(max(price_split(prof, loose, d, x)[1].peak_memory_bytes) for x in _splits(9, S * v))
    req = replace(loose, memory_limit=peaks[len(peaks) // 3])
    p = problem_of(prof, req, d)
    assert p.recompute_layers == 1
    every, kept = split_table(p, t, d, S, math.inf), split_table(p, t, d, S, req.memory_limit)
    assert every is not None and kept is not None
    inside = {tuple(x) for x in kept.sizes.tolist()}
    assert 0 < len(inside) < len(every.sizes)
    for sizes, bound in zip(every.sizes.tolist(), every.bounds, strict=True):
        _, s = price_split(prof, req, d, sizes, problem=p, times=t)
        assert bound <= s.iteration_s
        assert fits(s, req.memory_limit) == (tuple(sizes) in inside), sizes
    assert kept.need == pytest.approx(peaks[0], rel=1e-9)


@pytest.mark.parametrize("k", [1, 2])
def test_a_pinned_block_method_finds_the_best_split(k: int) -> None:
    for seed in range(20):
        prof, kw = case(seed, max_blocks=9)
        prof = _layered(prof.num_blocks, seed)
        kw = dict(kw, recompute="auto", recompute_layers=k)  # the block method is the one recomputation
        req = PlanRequest(
            devices=int(kw["stages"]),  # type: ignore[call-overload]
            batch_size=int(kw["batch_size"]),  # type: ignore[call-overload]
            memory_limit=float(kw["memory"]),  # type: ignore[arg-type]
            micro_batches=int(kw["micro_batches"]),  # type: ignore[call-overload]
            schedule=str(kw["schedule"]),
            recompute=Recompute.NEVER,
            link_bandwidth=4e9,
            link_latency_s=120e-6,
            action_overhead_s=default_action_overhead("cpu"),
            send_overhead_s=default_send_overhead("cpu"),
            recompute_layers=k,
        )
        want = best_split(prof, req, decisions(prof, req))
        try:
            got = _plan_profile(prof, kw).iteration_time_s
        except InfeasibleError:
            got = math.inf
        assert got == want or abs(got - want) <= 1e-9 * want, (seed, kw, got, want)


@pytest.mark.parametrize(
    "name", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "zb-h2", "v-half", "v-min", "dualpipe-v"]
)
def test_the_frontier_rows_give_every_peak_bit_for_bit(name: str) -> None:
    """The per-device peaks from the rows no other row dominates are exactly (==) those from all
    rows, on seeded random bytes per chunk (>= 0, with ties and zeros), and the frontier drops
    rows; with a negative byte count the full rows are read."""
    from autopipe.planner.exact import _frontier, _peaks, memory_rows

    rng = np.random.default_rng(7)
    for S, m in ((2, 4), (3, 6), (4, 16)):
        v = CHUNKED.get(name, 1)
        rows = memory_rows(name, S, m, v)
        assert rows is not None
        full = tuple(replace(d, held_top=None, before_top=None, b_top=None) for d in rows)
        assert any(d.held_top is not None and len(d.held_top) < len(d.held) for d in rows)
        for scale in (1.0, 1e9, 3e-7):
            N, K = 300, S * v
            held = rng.integers(0, 5, (N, K)) * rng.random((N, K)) * scale
            held[:, 0] = held[:, -1]  # ties between chunks
            transient = rng.random((N, K)) * scale
            static = rng.random((N, K)) * scale
            want = _peaks(full, static, held, transient, S)
            assert np.array_equal(_peaks(rows, static, held, transient, S), want)
            held[0, 0] = -1.0  # a negative count: the full rows
            assert np.array_equal(_peaks(rows, static, held, transient, S), _peaks(full, static, held, transient, S))
    points = np.array([[3.0, 0.0], [2.0, 2.0], [1.0, 1.0], [0.0, 3.0], [2.0, 1.0], [0.0, 0.0]])
    assert sorted(map(tuple, _frontier(points).tolist())) == [(0.0, 3.0), (2.0, 2.0), (3.0, 0.0)]
