"""autopipe/schedules/targets.py: what each framework runs as priced."""

from __future__ import annotations

import pytest

from autopipe.errors import PlanError
from autopipe.plans import Plan
from autopipe.schedules import schedule_names
from autopipe.schedules.targets import TARGETS, target_spec


def test_each_target_runs_its_schedules_and_recomputation() -> None:
    megatron, titan, torch = target_spec("megatron"), target_spec("torchtitan"), target_spec("torch")
    assert megatron.runs("1f1b", [True, True]) and megatron.runs("interleaved-1f1b", [False] * 4)
    assert not megatron.runs("1f1b", [True, False])  # one recomputation mode for every stage
    assert not megatron.runs("v-half", [False] * 4) and not megatron.runs("zb-v", [False] * 4)
    assert titan.runs("zb-v", [True] * 4) and titan.runs("dualpipe-v", [False] * 4)
    assert titan.runs("v-half", [False] * 4) and titan.runs("zb-h2", [False] * 2)  # from a schedule CSV
    assert not titan.runs("v-half", [True] * 4) and not titan.runs("zb-h2", [True] * 2)  # which cannot recompute
    assert all(torch.runs(name, [False, False]) for name in schedule_names())
    assert not any(torch.runs(name, [True, True]) for name in schedule_names())  # torch's stages, as traced
    assert all(target_spec("autopipe").runs(name, [False, True]) for name in schedule_names())


def test_what_each_target_searches_is_said_in_one_phrase() -> None:
    assert target_spec("megatron").searched() == (
        "1f1b or interleaved-1f1b, every stage recomputed or none, or selective recomputation, the block method or "
        "activation offload"
    )
    assert target_spec("torch").searched() == "any schedule, nothing recomputed" and target_spec("torch").restricts()
    assert target_spec("torchtitan").searched() == (
        "any schedule (v-half, v-min, zb-h2 with nothing recomputed), every stage recomputed or none"
    )
    assert target_spec("torchtitan").restricts() and target_spec("megatron").restricts()


def test_an_unknown_target_is_one_line_and_a_plan_field_defaults_to_autopipe() -> None:
    with pytest.raises(PlanError, match=r"^unknown target 'nemo'; use one of autopipe, megatron, torchtitan, torch$"):
        target_spec("nemo")
    assert TARGETS[0] == "autopipe" and Plan.__dataclass_fields__["target"].default == TARGETS[0]


def test_megatron_cuts_only_the_first_ranks_first_chunk_into_buckets() -> None:
    """Megatron-LM's DDP: buckets of max(40M, 1M x D) parameters on the first pipeline rank's first
    chunk, one bucket elsewhere; its gradient hooks reduce bucket by bucket only without
    interleaving (delay_grad_reduce launches every chunk's reduction after its last backward)."""
    rule = target_spec("megatron").ddp_buckets
    assert rule is not None and target_spec("megatron").grad_reduce_fp32
    assert target_spec("autopipe").ddp_buckets is None and not target_spec("autopipe").grad_reduce_fp32
    assert target_spec("torchtitan").grad_reduce_fp32  # FSDP2's mixed_precision_reduce "float32"
    params = [100e6, 100e6, 100e6, 100e6]  # interleaved: p = 2, v = 2, chunks on devices 0, 1, 0, 1
    assert rule.counts(params, [0, 1, 0, 1], 48, interleaved=True) == ((1, 1, 1, 1), (3, 1, 1, 1))  # 48M a bucket
    assert rule.counts(params[:2], [0, 1], 48, interleaved=False) == ((3, 1), (3, 1))
    assert rule.counts([50e6], [0], 8, interleaved=False) == ((2,), (2,))  # 40M a bucket
    assert rule.counts([50e6], [0], 64, interleaved=False) == ((1,), (1,))  # 64M a bucket
