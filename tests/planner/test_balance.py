"""A user's split (``--balance``, ``plan_profile(balance=)``): priced as the search prices
splits, autopipe's best beside it, bad balances refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

import autopipe
from autopipe import Choices
from autopipe.errors import InfeasibleError, PlanError
from autopipe.planner.assemble import plan_timeline
from autopipe.plans import Plan
from tests.planner.test_exact import NO_LIMIT, chain


def test_the_plan_is_the_users_split_priced_with_autopipes_best_beside_it(tmp_path: Path) -> None:
    prof = chain(8, 3)
    ours = autopipe.plan_profile(
        prof, stages=2, batch_size=8, memory=NO_LIMIT, choices=Choices(schedule="1f1b", micro_batches=4)
    )
    mine = autopipe.plan_profile(
        prof, stages=2, batch_size=8, memory=NO_LIMIT, choices=Choices(schedule="1f1b", micro_batches=4), balance=[7, 1]
    )
    assert [len(s.blocks) for s in mine.stages] == [7, 1] and (mine.schedule, mine.micro_batches) == ("1f1b", 4)
    assert plan_timeline(mine).iteration_s == pytest.approx(mine.iteration_time_s, rel=1e-12)
    first = mine.baselines[0]
    assert first.name == "autopipe" and first.iteration_time_s == ours.iteration_time_s
    assert first.stage_blocks == tuple(len(s.blocks) for s in ours.stages)
    assert ours.iteration_time_s < mine.iteration_time_s  # 7/1 is lopsided
    # autopipe's own split, given back as a balance, prices to the same plan
    again = autopipe.plan_profile(
        prof,
        stages=2,
        batch_size=8,
        memory=NO_LIMIT,
        choices=Choices(schedule="1f1b", micro_batches=4),
        balance=first.stage_blocks,
    )
    assert again.iteration_time_s == ours.iteration_time_s and again.stages == ours.stages
    mine.save(tmp_path / "mine.json")
    assert Plan.load(tmp_path / "mine.json") == mine


def test_v_balances_need_the_schedule_and_one_chunk_balances_search_one_chunk_schedules(tmp_path: Path) -> None:
    prof = chain(8, 4)
    path = tmp_path / "profile.json"
    path.write_text(prof.to_json())
    v = autopipe.plan_profile(
        path, stages=2, batch_size=8, memory=NO_LIMIT, choices=Choices(schedule="zb-v"), balance=[1, 3, 3, 1]
    )
    assert (v.schedule, v.virtual, [s.rank for s in v.stages], [len(s.blocks) for s in v.stages]) == (
        "zb-v",
        2,
        [0, 1, 1, 0],
        [1, 3, 3, 1],
    )
    one = autopipe.plan_profile(path, stages=2, batch_size=8, memory=NO_LIMIT, balance=[4, 4])
    assert one.virtual == 1 and [len(s.blocks) for s in one.stages] == [4, 4]
    assert all(a.virtual == 1 for a in one.alternatives)
    assert one.baselines[0].name.startswith("autopipe")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(balance=[4, 4, 0]), r"^balance entries must be positive block counts \(got 0\)"),
        (dict(balance=[4, 3]), r"^balance sums to 7 blocks but the model has 8; give blocks per chunk that sum to 8$"),
        (dict(balance=[3, 3, 2]), r"^balance has 3 entries for 2 devices; give 2 \(one chunk per device\) or 2 x v"),
        (
            dict(balance=[2, 2, 2, 2]),
            r"^balance has 4 entries = 2 devices x 2 chunks; "
            r"name the schedule that runs 2 chunks per device with schedule=",
        ),
        (
            dict(balance=[4, 4], choices=Choices(schedule="zb-v")),
            r"^balance has 2 entries but zb-v on 2 devices runs 4 chunks; give 4 entries$",
        ),
        (dict(balance="4,4"), r"^balance must be a sequence of blocks per chunk, like 4, 4"),
        (
            dict(balance=[4, 4], choices=Choices(virtual=2)),
            r"^balance has 2 entries = 2 devices x 1 chunks, but virtual= is 2; drop one$",
        ),
        (
            dict(balance=[4, 4], choices=Choices(schedule="1f1b"), memory=1),
            r"^the split 4,4 does not fit 1 B per device .* it needs .* per device",
        ),
    ],
)
def test_bad_balances_say_what_to_do(kw: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"stages": 2, "batch_size": 8, "memory": NO_LIMIT, **kw}
    error = InfeasibleError if "memory" in kw else PlanError
    with pytest.raises(error, match=message):
        autopipe.plan_profile(chain(8, 1), **args)  # type: ignore[arg-type]


def test_a_profile_must_be_a_profile_or_a_path() -> None:
    with pytest.raises(PlanError, match=r"^profile must be a Profile or the path of a profile JSON, not a int$"):
        autopipe.plan_profile(3, stages=2, batch_size=8, memory=NO_LIMIT)  # type: ignore[arg-type]
