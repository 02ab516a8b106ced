"""The words of selective recomputation and activation offload: a layer's units, and the module
kinds that recompute or offload them (torch-free, so plans and profiles read them without torch).

A *unit* is a part of a transformer layer (``graph/units.py`` finds each fx node's); a *module
kind* is what a user (and Megatron-LM) names: ``--recompute-modules core_attn mlp layernorm``,
``--offload-modules attn_norm qkv_linear core_attn attn_proj mlp_norm``.

Tests: tests/graph/test_layer_parts.py.
"""

from __future__ import annotations

__all__ = ["DISCARDING", "OFFLOAD_KINDS", "RECOMPUTE_KINDS", "UNITS"]

UNITS = (
    "attn_norm",
    "qkv_linear",
    "mla_up",
    "core_attn",
    "attn_proj",
    "mlp_norm",
    "mlp_fc1",
    "mlp_act",
    "mlp_fc2",
    "mlp_other",
)
"""A layer's parts, in the order they run (graph/units.py)."""

RECOMPUTE_KINDS: dict[str, tuple[str, ...]] = {
    # Megatron-LM's --recompute-modules names, and mlp_act: the dense MLP's activation (Megatron
    # recomputes an activation only in MoE experts, moe_act)
    "core_attn": ("core_attn",),
    "layernorm": ("attn_norm", "mlp_norm"),
    # multi-head latent attention's up-projections and rotary embedding, from the latents to the
    # queries, keys and values (Megatron-Core's multi_latent_attention.py, recompute_up_proj)
    "mla_up_proj": ("mla_up",),
    "mlp": ("mlp_fc1", "mlp_act", "mlp_fc2", "mlp_other"),
    "mlp_act": ("mlp_act",),
}
"""Module kinds that can be recomputed, and the units each is."""

DISCARDING = frozenset({"layernorm", "mla_up_proj", "mlp_act"})
"""Kinds recomputed with their output discarded too (Megatron's ``CheckpointWithoutOutput``): the
tensor the next module saved is freed and made again; the others keep their output (``checkpoint``)."""

OFFLOAD_KINDS: dict[str, tuple[str, ...]] = {
    # Megatron-Core's --offload-modules names for a dense layer (expert_fc1 and moe_act are MoE's)
    "attn_norm": ("attn_norm",),
    "qkv_linear": ("qkv_linear",),
    "core_attn": ("core_attn",),
    "attn_proj": ("attn_proj",),
    "mlp_norm": ("mlp_norm",),
}
"""Module kinds whose inputs can be offloaded to the host, and the units each is."""
