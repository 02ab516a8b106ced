"""Request checks: numbers are checked for size before anything loops over them."""

from __future__ import annotations

import pytest

from autopipe.planner.request import MAX_MICRO_BATCHES, divisors


def test_divisors_are_bounded_and_right() -> None:
    for n in range(1, 300):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]
    assert divisors(10**15, at_most=100) == [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 80, 100]
    assert divisors(2**61 - 1) == [1]  # a prime: only 1 is a micro-batch count that divides it


@pytest.mark.timeout(60)  # counting up to n would never end; to MAX_MICRO_BATCHES, well under a second
@pytest.mark.parametrize("n", [10**18, 2**61 - 1, 10**15 + 37])
def test_divisors_of_huge_numbers_stop_at_the_largest_micro_batch_count(n: int) -> None:
    ds = divisors(n)
    assert ds == [d for d in range(1, MAX_MICRO_BATCHES + 1) if n % d == 0]
    assert all(d <= MAX_MICRO_BATCHES for d in ds)


def test_a_profile_without_blocks_says_so() -> None:
    from autopipe.costs.profile import Profile
    from autopipe.errors import PlanError
    from autopipe.graph.recipe import TraceRecipe
    from autopipe.planner.request import PlanRequest, validate

    empty = Profile("m", TraceRecipe(fingerprint="fp"), "cpu", "-", "float32", (1,), "measured", (), ())
    with pytest.raises(
        PlanError, match=r"^the profile has no blocks, so there is nothing to cut; profile the model again$"
    ):
        validate(empty, PlanRequest(devices=2, batch_size=8, memory_limit=2**30))


def test_targets_run_what_their_frameworks_run() -> None:
    from autopipe.planner.request import TARGETS, target_spec
    from autopipe.schedules import schedule_names

    assert TARGETS[0] == "autopipe" and not target_spec("autopipe").restricts()
    assert target_spec("megatron").schedules == ("1f1b", "interleaved-1f1b")
    assert set(target_spec("torchtitan").recomputing()) == {  # torch's classes; the rest from a CSV
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "zb-h1",
        "zb-v",
        "dualpipe-v",
    }
    assert set(target_spec("torchtitan").schedules) == set(schedule_names())
    assert set(target_spec("torchtitan").no_recompute) == {"v-half", "v-min", "zb-h2"}
    assert set(target_spec("torch").schedules) == set(schedule_names()) and target_spec("torch").never_recomputes
    assert target_spec("megatron").uniform_recompute and target_spec("torchtitan").uniform_recompute
    assert not target_spec("torch").uniform_recompute


def test_a_pinned_schedule_the_target_does_not_run_is_one_line() -> None:
    from autopipe.errors import PlanError
    from autopipe.planner.request import PlanRequest, Words, validate
    from tests.planner.test_search import random_profile

    req = PlanRequest(devices=2, batch_size=4, memory_limit=2**34, schedule="zb-v", target="megatron")
    with pytest.raises(
        PlanError,
        match=r"^target=megatron schedule=zb-v: Megatron-LM runs 1f1b and interleaved-1f1b; "
        r"drop schedule or pick one of them$",
    ):
        validate(random_profile(6, 1), req)
    flags = Words((("target", "--target"), ("schedule", "--schedule")), " ")
    with pytest.raises(PlanError, match=r"^--target megatron --schedule zb-v: Megatron-LM runs .* drop --schedule or"):
        validate(random_profile(6, 1), req, flags)
    with pytest.raises(PlanError, match=r"^unknown target 'nemo'; use one of autopipe, megatron, torchtitan, torch$"):
        validate(random_profile(6, 1), PlanRequest(devices=2, batch_size=4, memory_limit=2**34, target="nemo"))


def test_a_profile_that_takes_no_time_is_one_line_not_an_infinite_throughput() -> None:
    import dataclasses

    from autopipe.costs.profile import Affine
    from autopipe.errors import PlanError
    from autopipe.planner.request import PlanRequest, validate
    from tests.helpers import hand_profile

    zero = Affine(0.0, 0.0)
    prof = hand_profile()
    timeless = dataclasses.replace(
        prof,
        blocks=tuple(
            dataclasses.replace(b, forward_s=zero, backward_s=zero, backward_input_s=zero, backward_weight_s=zero)
            for b in prof.blocks
        ),
    )
    req = PlanRequest(devices=2, batch_size=4, memory_limit=2**34, action_overhead_s=0.0)
    with pytest.raises(PlanError) as info:
        validate(timeless, req)
    assert str(info.value) == (
        "the profile's blocks take no time (every forward and backward 0 s) and nothing is charged per action; "
        "profile the model again, or give the executor's time per action (action_overhead_s=20us)"
    )
    validate(timeless, dataclasses.replace(req, action_overhead_s=2e-5))  # each action costs: plans compare
    validate(prof, req)
