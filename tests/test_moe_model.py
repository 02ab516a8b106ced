"""models/moe.py: published sizes from the formulas, the experts against a loop over tokens,
tracing, a training step with multi-token prediction, bad settings."""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import ROOT

torch.set_num_threads(1)


@functools.cache
def moe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_example_model_moe", ROOT / "models" / "moe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def layer_params(cfg: Any, dense: bool) -> int:
    """One decoder layer's parameters, term by term from the architecture."""
    h = cfg.n_embd
    if cfg.attention == "mla":
        qk, heads = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.n_head
        q = h * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * heads * qk if cfg.q_lora_rank else h * heads * qk
        kv = h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank
        kv += cfg.kv_lora_rank * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        attn = q + kv + heads * cfg.v_head_dim * h
    else:
        d = cfg.gqa_head_dim
        attn = 2 * h * cfg.n_head * d + 2 * h * cfg.kv_heads * d + (2 * d if cfg.qk_norm else 0)
    if dense:
        ffn = 3 * h * cfg.dense_ffn
    else:
        ffn = cfg.n_experts * h + cfg.n_experts * 3 * h * cfg.expert_ffn + 3 * h * cfg.n_shared_experts * cfg.expert_ffn
    return attn + ffn + 2 * h


@pytest.mark.parametrize(
    ("preset", "published", "mtp"),
    [
        ("deepseek-v3", 671e9, 11.5e9),  # README_WEIGHTS.md: 671B main model, 11.5B unique MTP parameters
        ("qwen3-235b-a22b", 235e9, 0.0),
        ("mixtral-8x7b", 46.7e9, 0.0),
    ],
)
def test_presets_have_the_published_sizes(preset: str, published: float, mtp: float) -> None:
    m = moe()
    cfg = m.make_config(preset)
    with torch.device("meta"):
        model = m.build_model(preset)
    h, V = cfg.n_embd, cfg.vocab_size
    main = 2 * V * h + h + sum(layer_params(cfg, i < cfg.n_dense_layers) for i in range(cfg.n_layer))
    extra = cfg.mtp_depth * (2 * h + 2 * h * h + layer_params(cfg, False))
    assert n_params(model) == main + extra
    assert n_params(model) - n_params(model.mtp) == main
    assert main == pytest.approx(published, rel=0.002)
    assert extra == pytest.approx(mtp, rel=0.02)


def reference_experts(x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, experts: Any) -> torch.Tensor:
    """Token by token: each (token, choice) pair in order goes to its expert while the expert has
    room (capacity), else it is dropped (GShard)."""
    n, k = chosen.shape
    E = experts.w_gate_up.shape[0]
    cap = -(-n * k * experts.cap_num // (E * experts.cap_den))
    taken = [0] * E
    out = torch.zeros_like(x)
    for i in range(n):
        for j in range(k):
            e = int(chosen[i, j])
            if taken[e] == cap:
                continue
            taken[e] += 1
            gate, up = (x[i] @ experts.w_gate_up[e]).chunk(2)
            out[i] += weights[i, j] * ((F.silu(gate) * up) @ experts.w_down[e])
    return out


@pytest.mark.parametrize("capacity_factor", [1.0, 0.5, 4.0])  # 4.0 = E / k: no pair is dropped
def test_experts_equal_a_loop_over_tokens(capacity_factor: float) -> None:
    m = moe()
    torch.manual_seed(0)
    cfg = m.make_config(capacity_factor=capacity_factor)
    experts = m.Experts(cfg)
    torch.nn.init.normal_(experts.w_gate_up, std=0.1)
    torch.nn.init.normal_(experts.w_down, std=0.1)
    x = torch.randn(24, cfg.n_embd)
    chosen = torch.randint(0, cfg.n_experts, (24, cfg.top_k))
    chosen[:12] = torch.tensor([0, 1])  # skewed: experts 0 and 1 overflow at capacity 1.0
    weights = torch.rand(24, cfg.top_k)
    got = experts(x, weights, chosen)
    assert torch.allclose(got, reference_experts(x, weights, chosen, experts), atol=1e-5)
    if capacity_factor == 4.0:  # nothing dropped: every token's top-k experts, as a dense MoE computes them
        full = torch.stack(
            [
                sum(
                    w * ((F.silu(g) * u) @ experts.w_down[e])
                    for w, e in zip(weights[i], chosen[i], strict=True)
                    for g, u in [(x[i] @ experts.w_gate_up[e]).chunk(2)]
                )
                for i in range(24)
            ]
        )
        assert torch.allclose(got, full, atol=1e-5)


def test_tiny_trains_one_step_with_multi_token_prediction() -> None:
    m = moe()
    torch.manual_seed(0)
    model = m.build_model()
    inputs, targets = m.example_inputs(2), m.example_targets(2)
    out = model(inputs)
    assert [tuple(o.shape) for o in out] == [(2, 64, 512), (2, 63, 512)]  # main, then token i + 2
    loss = m.loss_fn(out, targets)
    main = F.cross_entropy(out[0].flatten(0, 1), targets.flatten())
    depth1 = F.cross_entropy(out[1].flatten(0, 1), targets[:, 1:].flatten())
    assert loss.item() == pytest.approx((main + 0.1 * depth1).item(), rel=1e-6)
    loss.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []  # router, experts, MTP all learn


@pytest.mark.parametrize("kwargs", [{}, {"attention": "gqa", "n_kv_head": 2, "qk_norm": True, "mtp_depth": 0}])
def test_symbolic_trace_and_export_match_eager(kwargs: dict[str, Any]) -> None:
    m = moe()
    torch.manual_seed(0)
    model = m.build_model(**kwargs)
    x = m.example_inputs(2, **kwargs)
    with torch.no_grad():
        eager = model(x)
        for other in (torch.fx.symbolic_trace(model), torch.export.export(model, (x,), strict=False).module()):
            got = other(x)
            pairs = zip(got, eager, strict=True) if isinstance(eager, tuple) else [(got, eager)]
            assert all(torch.allclose(a, b, atol=1e-5) for a, b in pairs)


def test_meta_build_runs_and_counts_top_k() -> None:
    m = moe()
    with torch.device("meta"):
        model = m.build_model(preset="deepseek-v3", n_layer=4, block_size=256)
        loss = m.loss_fn(model(m.example_inputs(1, block_size=256)), m.example_targets(1, block_size=256))
    assert loss.is_meta
    assert model.layers[3].ffn.experts.w_gate_up.shape == (256, 7168, 4096)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"preset": "deepseek-v4"}, ValueError, "unknown preset 'deepseek-v4'"),
        ({"no_such": 1}, TypeError, "has no setting 'no_such'"),
        ({"attention": "linear"}, ValueError, "attention must be 'mla' or 'gqa'"),
        ({"top_k": 9}, ValueError, r"top_k \(9\) cannot exceed n_experts \(8\)"),
        ({"n_dense_layers": 5}, ValueError, "n_dense_layers"),
        ({"capacity_factor": 0}, ValueError, "capacity_factor"),
        ({"attention": "gqa", "n_kv_head": 3}, ValueError, "n_kv_head must divide n_head"),
        ({"n_experts": "eight"}, ValueError, "n_experts must be an integer"),
    ],
)
def test_bad_settings_are_one_line(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as info:
        with torch.device("meta"):
            moe().build_model(**kwargs)
    assert "\n" not in str(info.value)
