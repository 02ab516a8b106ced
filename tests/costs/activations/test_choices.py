"""Memory choices as profiles (costs/activations/choices.py): the menu the search tries, a choice applied to a
profile, and layer options kept in and read back from profile files."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from autopipe.costs.activations.choices import NO_CHOICE, RECOMPUTE_SETS, MemoryChoice, apply, choices
from autopipe.costs.profile import Affine, BlockCost, MemoryOption, Profile
from autopipe.errors import PlanError, ProfileError
from autopipe.graph.recipe import DEFAULT_RECIPE


def _layer(name: str, saved: float = 100.0) -> BlockCost:
    """A layer of 1 s forward, 2 s backward at every micro-batch size, ``saved`` bytes, with options:
    recomputing layernorm frees 30 bytes for 0.1 s, mlp_act 40 for 0.05 s, both 70 for 0.15 s,
    the mlp 60 for 0.5 s (beaten by both: fewer bytes kept, less time); offloading core_attn moves
    20 bytes, qkv_linear 10."""
    flat = Affine(0.0, 0.0)

    def option(kinds: tuple[str, ...], freed: float, seconds: float) -> MemoryOption:
        return MemoryOption(recompute=kinds, saved_bytes=Affine(saved - freed, 0.0), recompute_s=Affine(seconds, 0.0))

    def moved(kind: str, nbytes: float) -> MemoryOption:
        return MemoryOption(offload=(kind,), saved_bytes=Affine(saved - nbytes, 0.0), offload_bytes=Affine(nbytes, 0.0))

    return BlockCost(
        name=name,
        nodes=(name,),
        params=1,
        param_bytes=4,
        forward_s=Affine(1.0, 0.0),
        backward_s=Affine(2.0, 0.0),
        backward_input_s=Affine(1.0, 0.0),
        backward_weight_s=Affine(1.0, 0.0),
        saved_bytes=Affine(saved, 0.0),
        forward_flops=flat,
        layer=True,
        memory=(
            option(("layernorm",), 30, 0.1),
            option(("mlp_act",), 40, 0.05),
            option(("layernorm", "mlp_act"), 70, 0.15),
            option(("mlp",), 60, 0.5),
            moved("core_attn", 20.0),
            moved("qkv_linear", 10.0),
        ),
    )


def _profile() -> Profile:
    return Profile(
        model="m",
        recipe=DEFAULT_RECIPE,
        device="h100: NVIDIA H100 SXM5 80GB (analytic, bf16)",
        torch_version="2",
        dtype="bfloat16",
        micro_batch_sizes=(1, 2),
        method="analytic",
        blocks=(_layer("layers.0"), _layer("layers.1")),
        tensors=(),
    )


def test_a_choice_is_one_form_of_known_kinds() -> None:
    assert MemoryChoice(recompute=("mlp_act", "layernorm")).recompute == ("layernorm", "mlp_act")  # sorted
    assert NO_CHOICE.none and MemoryChoice(layers=2).said == "recompute 2 layers per stage"
    with pytest.raises(PlanError, match="are one choice"):
        MemoryChoice(recompute=("mlp",), offload=("core_attn",))
    with pytest.raises(PlanError, match="name each once, among attn_norm"):
        MemoryChoice(offload=("mlp",))
    with pytest.raises(PlanError, match="mlp recomputes the whole MLP"):
        MemoryChoice(recompute=("mlp", "mlp_act"))
    assert len(RECOMPUTE_SETS) == 23  # 2^5 - 1 sets of the five kinds, less the 8 with mlp and mlp_act


def test_the_menu_keeps_what_nothing_else_beats() -> None:
    profile = _profile()
    menu = choices(profile, 1.0)
    # layernorm (70 bytes kept per layer, 0.1 s) is beaten by mlp_act (60, 0.05 s), mlp (40, 0.5 s) by
    # both (30, 0.15 s); the sets the layers have no option for are not offered; fastest first
    assert menu == (MemoryChoice(recompute=("mlp_act",)), MemoryChoice(recompute=("layernorm", "mlp_act")))
    # a host link fast enough: offloading both kinds adds no time, so it beats its lower rung (core_attn
    # alone), but not mlp_act, which keeps less (60 bytes against 70)
    fast = choices(profile, 1.0, host_bandwidth=1e12)
    assert MemoryChoice(offload=("core_attn", "qkv_linear")) in fast
    assert MemoryChoice(offload=("core_attn",)) not in fast and MemoryChoice(recompute=("mlp_act",)) in fast


def test_a_recompute_choice_moves_bytes_and_time() -> None:
    profile = apply(_profile(), MemoryChoice(recompute=("layernorm", "mlp_act")))
    b = profile.blocks[0]
    assert (b.saved_bytes(1), b.backward_s(1), b.backward_input_s(1), b.forward_s(1)) == (30.0, 2.15, 1.15, 1.0)


def test_an_offload_choice_overlaps_the_copies_with_the_compute() -> None:
    slow = apply(_profile(), MemoryChoice(offload=("core_attn", "qkv_linear")), host_bandwidth=20.0)
    b = slow.blocks[0]  # 30 bytes at 20 bytes/s: 1.5 s each way, longer than the forward (1 s), not the backward
    assert (b.saved_bytes(1), b.forward_s(1), b.backward_s(1), b.staging_bytes(1)) == (70.0, 1.5, 2.0, 30.0)
    with pytest.raises(PlanError, match="host link bandwidth"):
        apply(_profile(), MemoryChoice(offload=("core_attn",)))


def test_options_round_trip_through_the_file_and_are_checked() -> None:
    profile = _profile()
    again = Profile.from_json(profile.to_json())
    assert again == profile
    raw = json.loads(profile.to_json())
    plain = json.loads(
        replace(profile, blocks=tuple(replace(b, layer=False, memory=()) for b in profile.blocks)).to_json()
    )
    assert not {"layer", "memory", "staging_bytes"} & set(plain["blocks"][0])  # left out where not known
    raw["blocks"][0]["memory"][0]["recompute"] = ["everything"]
    with pytest.raises(ProfileError, match=r"memory.recompute is \['everything'\], not a list of module kinds"):
        Profile.from_json(json.dumps(raw))
    raw = json.loads(profile.to_json())
    raw["blocks"][1]["memory"][2]["saved_bytes"] = {"intercept": -1, "slope": 0}
    with pytest.raises(ProfileError, match=r"recompute layernorm\+mlp_act saved_bytes"):
        Profile.from_json(json.dumps(raw))
