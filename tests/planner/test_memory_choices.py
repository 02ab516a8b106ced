"""The uniform memory choices in the search (planner/search.py, costs/activations/choices.py): selective
recomputation found with no flag where it fits and whole-stage recomputation is the only other
way, priced as the counted ops say; the block method and offload priced from their own numbers;
the pins and their one-line errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from autopipe import api
from autopipe.costs.devices import device_spec
from autopipe.costs.profile import BlockCost, Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.plans import Plan

ROOT = Path(__file__).resolve().parents[2]
GPT = str(ROOT / "models" / "gpt.py")
H100 = device_spec("h100")
PLAIN = api.Choices(schedule="1f1b", micro_batches=8)  # one decision: the memory it needs is the cuts' alone


@pytest.fixture(scope="module")
def gpt() -> Profile:
    """GPT (8 layers, 512 wide, 512 tokens) counted for H100s in bf16."""
    counts = api.count(GPT, {"n_layer": 8, "n_embd": 512, "n_head": 8, "block_size": 512}, H100)
    return api.price(counts, H100)


def _need(profile: Profile, choices: api.Choices) -> float:
    """The smallest per-device limit any plan of ``choices`` fits (the search's one-line error)."""
    with pytest.raises(InfeasibleError) as got:
        api.plan_profile(profile, stages=4, batch_size=16, memory=1, choices=choices)
    assert got.value.min_memory_bytes is not None
    return got.value.min_memory_bytes


def _plan(profile: Profile, memory: float, choices: api.Choices) -> Plan:
    return api.plan_profile(profile, stages=4, batch_size=16, memory=memory, choices=choices)


def test_selective_recomputation_is_found_where_whole_stages_are_the_only_other_way(gpt: Profile) -> None:
    nothing = replace(PLAIN, recompute_modules=(), recompute_layers=0, offload_modules=())  # no uniform choice
    plain = _need(gpt, replace(nothing, recompute=api.Recompute.NEVER))
    whole = _need(gpt, replace(nothing, recompute=api.Recompute.ALWAYS))
    # what the set that keeps least needs (every layer's norms, attention core and MLP again)
    selective = _need(gpt, replace(PLAIN, recompute_modules=("core_attn", "layernorm", "mlp")))
    assert whole < selective < plain  # it keeps less than all, more than recomputing every stage
    # no offload, no block method: selective recomputation is left to the search, unpinned
    free = replace(PLAIN, offload_modules=(), recompute_layers=0)
    limit = (selective + plain) / 2
    stages_only = _plan(gpt, limit, nothing)
    assert any(s.recompute for s in stages_only.stages) and not stages_only.memory_choice  # the only other way
    plan = _plan(gpt, limit, free)
    assert plan.recompute_modules and not any(s.recompute for s in plan.stages)
    assert plan.iteration_time_s < stages_only.iteration_time_s
    assert max(plan.peak_memory_bytes) <= limit
    # priced as the counted ops say: each stage keeps its layers' counted bytes under the choice
    # and runs their recomputed forward in its backward
    u = plan.micro_batch_size
    for s in plan.stages:
        blocks = [gpt.blocks[i] for i in s.block_indices]
        options = [next((o for o in b.memory if o.recompute == plan.recompute_modules), None) for b in blocks]
        held = sum(
            o.saved_bytes(u) if o is not None else b.saved_bytes(u) for b, o in zip(blocks, options, strict=True)
        )
        again = sum(o.recompute_s(u) for o in options if o is not None)
        assert s.held_bytes == pytest.approx(held, rel=1e-12)
        assert s.backward_s == pytest.approx(sum(b.backward_s(u) for b in blocks) + again, rel=1e-12)
        assert s.forward_s == pytest.approx(sum(b.forward_s(u) for b in blocks), rel=1e-12)


def test_a_pinned_set_is_the_plans_and_none_pins_nothing(gpt: Profile) -> None:
    pinned = _plan(gpt, 2**50, replace(PLAIN, recompute_modules=("mlp",)))
    assert pinned.recompute_modules == ("mlp",) and pinned.memory_choice == "recompute mlp"
    assert not _plan(gpt, 2**50, PLAIN).memory_choice  # unlimited memory: nothing is worth its time


def test_the_block_method_keeps_each_stages_first_layers_inputs(gpt: Profile) -> None:
    plan = _plan(gpt, 2**50, replace(PLAIN, recompute_layers=1))
    assert plan.recompute_layers == 1 and not any(s.recompute for s in plan.stages)
    u = plan.micro_batch_size
    inputs = {t.dsts[0]: t.bytes(u) for t in gpt.tensors if len(t.dsts) == 1 and t.src >= 0}
    for s in plan.stages:
        blocks = list(s.block_indices)
        first = next(i for i in blocks if gpt.blocks[i].layer)  # the stage's first layer, recomputed whole
        held = sum(gpt.blocks[i].saved_bytes(u) for i in blocks) - gpt.blocks[first].saved_bytes(u) + inputs[first]
        assert s.held_bytes == pytest.approx(held, rel=1e-12)
        assert s.transient_bytes == gpt.blocks[first].saved_bytes(u)
        extra = gpt.blocks[first].forward_s(u)
        assert s.backward_s == pytest.approx(sum(gpt.blocks[i].backward_s(u) for i in blocks) + extra, rel=1e-12)


def test_offload_moves_bytes_over_the_host_link(gpt: Profile) -> None:
    plan = _plan(gpt, 2**50, replace(PLAIN, offload_modules=("core_attn", "qkv_linear")))
    u = plan.micro_batch_size
    for s in plan.stages:
        for i in s.block_indices:
            b = gpt.blocks[i]
            moved = sum(o.offload_bytes(u) for o in b.memory if o.offload and o.offload[0] in plan.offload_modules)
            assert not b.layer or moved > 0
        layers = [gpt.blocks[i] for i in s.block_indices]
        moved = sum(
            o.offload_bytes(u) for b in layers for o in b.memory if o.offload and o.offload[0] in plan.offload_modules
        )
        kept = sum(b.saved_bytes(u) for b in layers) - moved
        assert s.held_bytes == pytest.approx(kept, rel=1e-9)
        # the copies overlap the compute: the forward is the larger of the two, per layer
        f = sum(max(b.forward_s(u), m / H100.host_bandwidth) for b, m in _moved(layers, plan.offload_modules, u))
        assert s.forward_s == pytest.approx(f, rel=1e-6)


def _moved(layers: list[BlockCost], kinds: tuple[str, ...], u: int) -> list[tuple[BlockCost, float]]:
    return [(b, sum(o.offload_bytes(u) for o in b.memory if o.offload and o.offload[0] in kinds)) for b in layers]


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        (api.Choices(recompute_modules=("core_attn", "bogus")), r"name each once, among core_attn"),
        (
            api.Choices(recompute_modules=("mlp",), recompute_layers=2),
            r"recompute modules, offload modules and recomputed layers are one choice",
        ),
        (api.Choices(recompute_modules=("mlp",), recompute=api.Recompute.ALWAYS), r"contradict each other"),
        (api.Choices(recompute_layers=1, recompute=api.Recompute.NEVER), r"contradict each other"),
        (api.Choices(recompute_modules=("mlp_act",), target="megatron"), r"Megatron-LM does not run it"),
    ],
)
def test_pins_that_cannot_be_planned_are_one_line(gpt: Profile, choices: api.Choices, message: str) -> None:
    with pytest.raises(PlanError, match=message) as got:
        api.plan_profile(gpt, stages=4, batch_size=16, choices=choices)
    assert "\n" not in str(got.value)


def test_a_negative_layer_count_is_one_line() -> None:
    with pytest.raises(PlanError, match=r"^recompute_layers must be an integer >= 0 \(got -1\)$"):
        api.Choices(recompute_layers=-1)


def test_offload_needs_a_host_link(gpt: Profile) -> None:
    nameless = replace(gpt, device="an unknown GPU (analytic, bf16)")
    with pytest.raises(PlanError, match=r"offloading needs the device's host link bandwidth"):
        api.plan_profile(nameless, stages=4, batch_size=16, choices=api.Choices(offload_modules=("core_attn",)))
    plan = api.plan_profile(nameless, stages=4, batch_size=16, memory=_need(nameless, PLAIN) * 1.05, choices=PLAIN)
    assert not plan.offload_modules  # no host link known: nothing offloaded


def test_a_profile_without_layer_parts_offers_no_choice(gpt: Profile) -> None:
    bare = replace(gpt, blocks=tuple(replace(b, layer=False, memory=()) for b in gpt.blocks))
    with pytest.raises(PlanError, match=r"the profile has no transformer layer whose parts it knows"):
        api.plan_profile(bare, stages=4, batch_size=16, choices=api.Choices(recompute_modules=("mlp",)))
    tight = _need(bare, replace(PLAIN, recompute=api.Recompute.NEVER)) * 0.9
    plan = api.plan_profile(bare, stages=4, batch_size=16, memory=tight, choices=PLAIN)
    assert not plan.memory_choice and any(s.recompute for s in plan.stages)


def test_a_users_split_is_priced_under_a_pinned_choice(gpt: Profile) -> None:
    n = gpt.num_blocks
    balance = [n // 4] * 3 + [n - 3 * (n // 4)]
    choices = replace(PLAIN, recompute_modules=("mlp",))
    plan = api.plan_profile(gpt, stages=4, batch_size=16, memory=2**40, choices=choices, balance=balance)
    assert plan.balance == tuple(balance) and plan.recompute_modules == ("mlp",)
    u = plan.micro_batch_size
    for s in plan.stages:
        again = sum(o.recompute_s(u) for i in s.block_indices for o in gpt.blocks[i].memory if o.recompute == ("mlp",))
        assert s.backward_s == pytest.approx(sum(gpt.blocks[i].backward_s(u) for i in s.block_indices) + again)


def test_the_block_ladder_tries_every_k_to_4_then_steps_by_a_third_and_ends_at_the_most() -> None:
    from itertools import pairwise

    from autopipe.planner.search import block_ladder

    assert block_ladder(0) == [] and block_ladder(1) == [1] and block_ladder(4) == [1, 2, 3, 4]
    assert block_ladder(11) == [1, 2, 3, 4, 5, 7, 9, 11]
    ks = block_ladder(47)
    assert ks[-1] == 47 and ks == sorted(set(ks)) and len(ks) == 13
    assert all(b <= a * 4 / 3 + 1 for a, b in pairwise(ks))  # a k between two tried ones: at most a quarter fewer
