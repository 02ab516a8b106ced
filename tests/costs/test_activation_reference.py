"""What the bundled transformers save for backward, checked against a reference and against eager.

Reference: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Sec. 4.1: a GPT layer saves ``sbh(34 + 5as/h)`` bytes in 16-bit precision (s sequence, b
micro-batch, h width, a heads): the attention block ``11sbh + 5as^2b`` (the QKV input 2sbh, Q and
K 4sbh, V 2sbh, the projection's input 2sbh, its dropout mask sbh, and the scores: softmax output,
dropout mask and output, 5as^2b), the MLP ``19sbh`` (input 2sbh, GeLU input 8sbh, its output 8sbh,
dropout mask sbh), the two layer norms ``4sbh`` (their inputs). With flash attention the scores
are not kept: the kernel saves q, k, v, its output and the fp32 log-sum-exp (4asb). The bundled
models run without dropout, so its masks (2sbh) are not saved either. For a Llama layer, the same
accounting with its parts: two RMSNorm inputs (4sbh) and their fp32 reciprocal RMS (2 x 4sb);
q 2sbh and k, v 2sbh each times kv_heads / heads (grouped-query attention); SwiGLU's gate and up
(2 x 2sbf) and their product (2sbf), the MLP input 2sbh; the rotary tables (the fused rotary kernel
keeps them, Megatron-Core's ``apply_rope_fusion``).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from autopipe.costs.activations.fp8 import saved_bytes_fp8_linears
from autopipe.costs.measure.timing import saved_bytes, storage_key
from autopipe.costs.sdpa import _GroupedFlash, fused_attention
from tests.helpers import ROOT


@functools.cache
def _model_file(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_reference_model_{name}", ROOT / "models" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layer_bytes(layer: torch.nn.Module, x: torch.Tensor, fp8: bool = False) -> int:
    """Bytes a layer saves for backward on the meta device, as the analytic profile counts them
    (``fp8``: its linear layers' inputs kept in FP8, as Transformer Engine keeps them)."""
    count = saved_bytes_fp8_linears if fp8 else saved_bytes
    with fused_attention():
        return count(lambda: layer(x), exclude={storage_key(p) for p in layer.parameters()})


S, B, H, HEADS = 256, 2, 512, 8


def test_gpt_layer_saves_korthikanti_bytes_with_flash_attention() -> None:
    gpt = _model_file("gpt")
    with torch.device("meta"):
        block = gpt.Block(gpt.make_config(n_layer=1, n_head=HEADS, n_embd=H, block_size=S)).to(torch.bfloat16)
        x = torch.empty(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    sbh = S * B * H
    korthikanti = sbh * (34 + 5 * HEADS * S / H)
    scores, dropout_masks = 5 * HEADS * S * S * B, 2 * sbh  # not kept: flash attention, no dropout
    lse, ln_stats = 4 * HEADS * S * B, 2 * 2 * 4 * S * B  # fp32 log-sum-exp; each LayerNorm's mean and rstd
    assert _layer_bytes(block, x) == korthikanti - scores - dropout_masks + lse + ln_stats


@pytest.mark.parametrize(("kv_heads", "mlp"), [(2, "swiglu"), (8, "swiglu"), (2, "relu2")])
def test_llama_layer_saves_what_fused_kernels_save(kv_heads: int, mlp: str) -> None:
    llama = _model_file("llama")
    f = 3 * H
    cfg = llama.make_config(
        n_layer=1, n_head=HEADS, n_kv_head=kv_heads, n_embd=H, block_size=S, intermediate_size=f, mlp=mlp
    )
    with torch.device("meta"):
        cos, sin = (t.to("meta") for t in llama.rotary_tables(cfg))
        layer = llama.DecoderLayer(cfg, cos, sin).to(torch.bfloat16)
        x = torch.empty(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    sbh, sbf = S * B * H, S * B * f
    norms = 2 * 2 * sbh + 2 * 4 * S * B  # inputs (bf16), reciprocal RMS (fp32)
    attention = 2 * sbh + 2 * sbh + 2 * 2 * sbh * kv_heads // HEADS + 2 * sbh + 4 * HEADS * S * B
    # MLP input; SwiGLU: gate and up (what the fused kernel saves) and their product (down's input);
    # squared ReLU (eager in Megatron-Core too): the ReLU's output, saved by the square, and the square
    act = 2 * 2 * sbf + 2 * sbf if mlp == "swiglu" else 2 * sbf + 2 * sbf
    rope = 2 * S * cfg.head_dim * 2  # cos and sin, bf16
    assert _layer_bytes(layer, x) == norms + attention + 2 * sbh + act + rope


def test_fp8_linear_layers_keep_their_inputs_in_one_byte() -> None:
    """Transformer Engine's Linear keeps its FP8-cast input (module docstring of activations.fp8):
    the QKV and MLP inputs (the norms' outputs) and the down projection's input (SwiGLU's product)
    at one byte an element; the output projection's input is flash attention's output, which
    attention keeps in bf16, so its FP8 copy is one byte more; everything else as in bf16."""
    llama = _model_file("llama")
    f = 3 * H
    cfg = llama.make_config(n_layer=1, n_head=HEADS, n_kv_head=2, n_embd=H, block_size=S, intermediate_size=f)
    with torch.device("meta"):
        cos, sin = (t.to("meta") for t in llama.rotary_tables(cfg))
        layer = llama.DecoderLayer(cfg, cos, sin).to(torch.bfloat16)
        x = torch.empty(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    sbh, sbf = S * B * H, S * B * f
    bf16 = _layer_bytes(layer, x)
    assert _layer_bytes(layer, x, fp8=True) == bf16 - sbh - sbh + sbh - sbf


def _eager_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama reference's RMSNorm (computed in fp32, or wider)."""
    x32 = x.to(torch.promote_types(x.dtype, torch.float32))
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def _same_values_and_grads(
    fused: Callable[..., torch.Tensor], eager: Callable[..., torch.Tensor], *args: object
) -> None:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    out_f, out_e = fused(*args), eager(*args)
    torch.testing.assert_close(out_f, out_e, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out_e)
    g_f = torch.autograd.grad(out_f, tensors, grad)
    g_e = torch.autograd.grad(out_e, tensors, grad)
    for a, b in zip(g_f, g_e, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_llama_fused_kernels_match_the_eager_formulas_in_fp64() -> None:
    llama = _model_file("llama")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=g, requires_grad=True)
    w = (1 + 0.1 * torch.randn(16, dtype=torch.float64, generator=g)).requires_grad_(True)
    _same_values_and_grads(llama.rms_norm, _eager_rms_norm, x, w, 1e-5)
    gate = torch.randn(3, 5, 24, dtype=torch.float64, generator=g, requires_grad=True)
    up = torch.randn(3, 5, 24, dtype=torch.float64, generator=g, requires_grad=True)
    _same_values_and_grads(llama.swiglu, lambda a, b: F.silu(a) * b, gate, up)


def test_grouped_flash_matches_repeated_heads_in_fp64() -> None:
    """The meta device's grouped-query attention path, run on CPU tensors: the same output and
    gradients as repeating the key/value heads and calling attention on them."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 7, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 7, 8, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(2, 2, 7, 8, dtype=torch.float64, generator=g, requires_grad=True)

    def repeated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    _same_values_and_grads(lambda q, k, v: _GroupedFlash.apply(q, k, v, True, None), repeated, q, k, v)
