"""Llama-2-style decoder-only transformer, as an autopipe model file.

    autopipe profile models/llama.py -k n_layer=8
    autopipe plan models/llama.py -k preset=llama2-70b        # analytic: built on the meta device

Token embedding, ``n_layer`` pre-RMSNorm layers in ``layers`` (grouped-query attention with
rotary position embedding, SwiGLU MLP), a final RMSNorm and an untied LM head (Touvron et al.
2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models"; RMSNorm: Zhang & Sennrich 2019;
RoPE: Su et al. 2021; SwiGLU: Shazeer 2020; GQA: Ainslie et al. 2023). No biases anywhere.

The SwiGLU width follows Meta's reference code unless ``intermediate_size`` is given:

    h = int(2 * 4 * n_embd / 3);  h = int(ffn_dim_multiplier * h) if set;  round h up to multiple_of

which gives 11008 (7B), 13824 (13B) and 28672 (70B: multiple_of 4096, multiplier 1.3).

``-k mlp=relu2`` replaces SwiGLU by a two-matrix MLP with squared-ReLU activation (So et al.
2021, "Primer"), as Nemotron-4 has; ``intermediate_size`` is then its width.

Presets (``-k preset=NAME``; explicit kwargs override its fields):

    tiny           4 layers,   128 wide,   4 heads,  2 kv heads,   64 tokens, vocab    512  (default)
    llama2-7b     32 layers,  4096 wide,  32 heads, 32 kv heads, 4096 tokens, vocab  32000    6,738,415,616
    llama2-13b    40 layers,  5120 wide,  40 heads, 40 kv heads, 4096 tokens, vocab  32000   13,015,864,320
    llama2-70b    80 layers,  8192 wide,  64 heads,  8 kv heads, 4096 tokens, vocab  32000   68,976,648,192
    llama3-8b     32 layers,  4096 wide,  32 heads,  8 kv heads, 8192 tokens, vocab 128256    8,030,261,248
    llama3-70b    80 layers,  8192 wide,  64 heads,  8 kv heads, 8192 tokens, vocab 128256   70,553,706,496
    llama3.1-405b 126 layers, 16384 wide, 128 heads,  8 kv heads, 8192 tokens, vocab 128256 405,853,388,800
    nemotron4-340b 96 layers, 18432 wide,  96 heads,  8 kv heads, 4096 tokens, vocab 256000 341,025,638,400

Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 3): SwiGLU widths 14336,
28672 and 53248, RoPE base 500,000. Nemotron-4 340B (NVIDIA 2024, "Nemotron-4 340B Technical
Report", Table 1): squared-ReLU MLP of width 73728, untied embeddings, no biases, RoPE; its
LayerNorm is an RMSNorm here (the same parameters less a bias per norm, no FLOPs either way).

The layer runs as the fused kernels of the frameworks that train these models (Megatron-Core
with Transformer Engine): RMSNorm and SwiGLU are autograd functions that save for backward what
those kernels save (:class:`FusedRMSNorm`, :class:`FusedSwiGLU`), and grouped-query attention
passes k and v with their own heads to the attention kernel (``enable_gqa``), so the bytes an
analytic profile counts are theirs; values and gradients are the eager formulas'
(``tests/costs/test_activation_reference.py``, which also checks a layer's saved bytes against
Korthikanti et al. 2022's per-layer accounting).

The rotary tables are computed once, at construction, and registered as non-persistent buffers
(shared by every layer, so each layer maps x to x alone). A model built on the meta device has
meta tables: build on a real device to run it.
"""

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class LlamaConfig:
    n_layer: int = 4  # decoder layers
    n_head: int = 4  # query heads; n_embd must be a multiple of n_head
    n_kv_head: int = 2  # key/value heads (grouped-query attention); divides n_head
    n_embd: int = 128  # model width C
    vocab_size: int = 512  # token vocabulary V
    block_size: int = 64  # sequence length T (size of the rotary tables and of example batches)
    intermediate_size: int | None = None  # SwiGLU width; None: the Llama rule below
    multiple_of: int = 32  # the rule rounds the SwiGLU width up to a multiple of this
    ffn_dim_multiplier: float | None = None  # the rule scales 8/3 * n_embd by this first
    norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 10000.0  # rotary base frequency
    mlp: str = "swiglu"  # "swiglu" (gate, up, down) or "relu2" (up, squared ReLU, down: Nemotron-4)

    def __post_init__(self) -> None:
        ints = ("n_layer", "n_head", "n_kv_head", "n_embd", "vocab_size", "block_size", "multiple_of")
        for name in ints:
            _check_positive_int(name, getattr(self, name))
        if self.intermediate_size is not None:
            _check_positive_int("intermediate_size", self.intermediate_size)
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"n_embd must be n_head times an even head size (n_embd: {self.n_embd}, "
                f"n_head: {self.n_head}); change one of them"
            )
        if self.mlp not in MLPS:
            raise ValueError(f"mlp must be one of {', '.join(MLPS)} (got {self.mlp!r}); pass e.g. -k mlp=swiglu")
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"n_kv_head must divide n_head (n_head: {self.n_head}, n_kv_head: {self.n_kv_head}); change one of them"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def hidden_act(self) -> str:
        """The MLP's activation as Hugging Face configs name it (``silu`` gates SwiGLU)."""
        return "silu" if self.mlp == "swiglu" else "relu2"

    @property
    def ffn_hidden(self) -> int:
        """The SwiGLU width: ``intermediate_size``, or Meta's rule from the model width."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        hidden = int(2 * 4 * self.n_embd / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


MLPS = ("swiglu", "relu2")


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer (got {value!r}); pass e.g. -k {name}=8")


_LLAMA2 = LlamaConfig(vocab_size=32000, block_size=4096, multiple_of=256)
_LLAMA3 = LlamaConfig(n_head=8, n_kv_head=8, vocab_size=128256, block_size=8192, rope_theta=500000.0)
PRESETS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(),
    "llama2-7b": replace(_LLAMA2, n_layer=32, n_head=32, n_kv_head=32, n_embd=4096),
    "llama2-13b": replace(_LLAMA2, n_layer=40, n_head=40, n_kv_head=40, n_embd=5120),
    "llama2-70b": replace(
        _LLAMA2,
        n_layer=80,
        n_head=64,
        n_kv_head=8,
        n_embd=8192,
        multiple_of=4096,
        ffn_dim_multiplier=1.3,
    ),
    "llama3-8b": replace(_LLAMA3, n_layer=32, n_head=32, n_embd=4096, intermediate_size=14336),
    "llama3-70b": replace(_LLAMA3, n_layer=80, n_head=64, n_embd=8192, intermediate_size=28672),
    "llama3.1-405b": replace(_LLAMA3, n_layer=126, n_head=128, n_embd=16384, intermediate_size=53248),
    "nemotron4-340b": LlamaConfig(
        n_layer=96,
        n_head=96,
        n_kv_head=8,
        n_embd=18432,
        vocab_size=256000,
        block_size=4096,
        intermediate_size=73728,
        mlp="relu2",
    ),
}


def make_config(
    preset: str = "tiny",
    n_layer: int | None = None,
    n_head: int | None = None,
    n_kv_head: int | None = None,
    n_embd: int | None = None,
    vocab_size: int | None = None,
    block_size: int | None = None,
    intermediate_size: int | None = None,
    multiple_of: int | None = None,
    ffn_dim_multiplier: float | None = None,
    norm_eps: float | None = None,
    rope_theta: float | None = None,
    mlp: str | None = None,
) -> LlamaConfig:
    """The preset's config with every argument that is not None put in its place."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    overrides: dict[str, Any] = {
        "n_layer": n_layer,
        "n_head": n_head,
        "n_kv_head": n_kv_head,
        "n_embd": n_embd,
        "vocab_size": vocab_size,
        "block_size": block_size,
        "intermediate_size": intermediate_size,
        "multiple_of": multiple_of,
        "ffn_dim_multiplier": ffn_dim_multiplier,
        "norm_eps": norm_eps,
        "rope_theta": rope_theta,
        "mlp": mlp,
    }
    return replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})


class FusedRMSNorm(torch.autograd.Function):
    """``x / rms(x) * weight``, computed in fp32, saving for backward only its input, the weight and
    the fp32 reciprocal of each row's RMS: Transformer Engine's RMSNorm, which Megatron-Core runs
    (``TENorm`` / ``TELayerNormColumnParallelLinear``; ``transformer_engine/pytorch/module/rmsnorm.py``
    saves ``inp, weight, rsigma``), not eager autograd's fp32 copy of the input and the normalised
    rows (three more ``(B, T, C)`` tensors). The same values and gradients as the eager formula."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        x32 = x.to(_wide(x))  # fp32 (fp64 stays fp64)
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd).type_as(x) * weight

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        wide = _wide(x)
        normed = x.to(wide) * rstd
        g = grad.to(wide) * weight.to(wide)
        dx = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        dweight = (grad.to(wide) * normed.type_as(x).to(wide)).flatten(0, -2).sum(0)
        return dx.type_as(x), dweight.type_as(weight), None


def _wide(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    out: Tensor = FusedRMSNorm.apply(x, weight, eps)
    return out


torch.fx.wrap("rms_norm")  # one node in a symbolic trace: the fused kernel, not its parts


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:  # x: (..., C)
        return rms_norm(x, self.weight, self.eps)  # (..., C)


class FusedSwiGLU(torch.autograd.Function):
    """``silu(gate) * up``, saving for backward only its two inputs and recomputing the rest there:
    Megatron-Core's fused ``bias_swiglu_impl`` (``megatron/core/fusions/fused_bias_swiglu.py``,
    ``SwiGLUFunction`` saves its input ``[gate, up]``; ``swiglu_back`` is the backward below) and
    Transformer Engine's ``LayerNormMLP`` (saves ``fc1_out``), not eager autograd's ``silu(gate)``
    beside them. The same values and gradients as the eager formula."""

    @staticmethod
    def forward(ctx: Any, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        return grad * up * sig * (1 + gate * (1 - sig)), grad * F.silu(gate)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    out: Tensor = FusedSwiGLU.apply(gate, up)
    return out


torch.fx.wrap("swiglu")  # one node in a symbolic trace: the fused kernel, not its parts


def rotary_tables(cfg: LlamaConfig) -> tuple[Tensor, Tensor]:
    """cos and sin of position * theta^(-2i/d), each (block_size, head_dim), halves repeated."""
    exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim  # 2i/d
    inv_freq = cfg.rope_theta**-exponents  # (hd/2,)
    angles = torch.outer(torch.arange(cfg.block_size, dtype=torch.float32), inv_freq)  # (T, hd/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, hd)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (i, i + hd/2) of x (B, h, T, hd) by the position angles (T, hd)."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (B, h, T, hd)
    return x * cos + rotated * sin


class Attention(nn.Module):
    cos: Tensor
    sin: Tensor

    def __init__(self, cfg: LlamaConfig, cos: Tensor, sin: Tensor) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.n_kv_head = cfg.n_kv_head
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)
        self.register_buffer("cos", cos, persistent=False)  # (block_size, hd), shared
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, C)
        t = x.size(1)
        cos, sin = self.cos.narrow(0, 0, t), self.sin.narrow(0, 0, t)  # (T, hd)
        q_heads, kv_heads = (self.n_head, self.head_dim), (self.n_kv_head, self.head_dim)
        q = self.q_proj(x).unflatten(-1, q_heads).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).unflatten(-1, kv_heads).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).unflatten(-1, kv_heads).transpose(1, 2)  # (B, nkv, T, hd)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # each kv head serves n_head / n_kv_head query heads, inside the kernel (enable_gqa: the
        # heads repeated as repeat_interleave on dim 1 would): flash attention saves k and v with
        # their own heads (flash-attn's FlashAttnFunc saves q, k, v, out, softmax_lse, and runs
        # MQA/GQA "by passing in KV with fewer heads than Q"), not repeated copies
        gqa = self.n_kv_head != self.n_head
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)  # (B, nh, T, hd)
        out: Tensor = self.o_proj(y.transpose(1, 2).flatten(2))
        return out  # (B, T, C)


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, C)
        out: Tensor = self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
        return out  # (B, T, C)


class SquaredReLU(nn.Module):
    """up, relu(.)**2, down: the MLP of Nemotron-4 (and Primer)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, C)
        out: Tensor = self.down_proj(F.relu(self.up_proj(x)).square())
        return out  # (B, T, C)


class DecoderLayer(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: LlamaConfig, cos: Tensor, sin: Tensor) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attn = Attention(cfg, cos, sin)
        self.mlp_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.mlp = SwiGLU(cfg) if cfg.mlp == "swiglu" else SquaredReLU(cfg)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, C)
        x = x + self.attn(self.attn_norm(x))
        out: Tensor = x + self.mlp(self.mlp_norm(x))
        return out  # (B, T, C)


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        cos, sin = rotary_tables(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(DecoderLayer(cfg, cos, sin) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)  # untied
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:  # idx: (B, T) int64, T <= block_size
        x = self.embed_tokens(idx)  # (B, T, C)
        for layer in self.layers:
            x = layer(x)  # (B, T, C)
        logits: Tensor = self.lm_head(self.norm(x))
        return logits  # (B, T, V)


def build_model(
    preset: str = "tiny",
    n_layer: int | None = None,
    n_head: int | None = None,
    n_kv_head: int | None = None,
    n_embd: int | None = None,
    vocab_size: int | None = None,
    block_size: int | None = None,
    intermediate_size: int | None = None,
    multiple_of: int | None = None,
    ffn_dim_multiplier: float | None = None,
    norm_eps: float | None = None,
    rope_theta: float | None = None,
    mlp: str | None = None,
) -> Llama:
    """A randomly initialised Llama; any argument left None comes from the preset."""
    cfg = make_config(
        preset,
        n_layer,
        n_head,
        n_kv_head,
        n_embd,
        vocab_size,
        block_size,
        intermediate_size,
        multiple_of,
        ffn_dim_multiplier,
        norm_eps,
        rope_theta,
        mlp,
    )
    return Llama(cfg)


def _tokens(batch_size: int, preset: str, vocab_size: int | None, block_size: int | None) -> Tensor:
    """A fixed (B, T + 1) token sequence: inputs are [:, :-1], next-token targets [:, 1:]."""
    cfg = make_config(preset, vocab_size=vocab_size, block_size=block_size)
    g = torch.Generator().manual_seed(0)
    shape = (batch_size, cfg.block_size + 1)
    seq = torch.randint(0, cfg.vocab_size, shape, generator=g, device="cpu")
    return seq.to(torch.get_default_device())  # (B, T + 1)


def example_inputs(
    batch_size: int,
    preset: str = "tiny",
    vocab_size: int | None = None,
    block_size: int | None = None,
    **_unused: object,
) -> Tensor:
    return _tokens(batch_size, preset, vocab_size, block_size)[:, :-1]  # (B, T) int64


def example_targets(
    batch_size: int,
    preset: str = "tiny",
    vocab_size: int | None = None,
    block_size: int | None = None,
    **_unused: object,
) -> Tensor:
    return _tokens(batch_size, preset, vocab_size, block_size)[:, 1:]  # (B, T) next tokens


def loss_fn(output: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy: output (B, T, V) logits, targets (B, T) ids."""
    return F.cross_entropy(output.flatten(0, 1), targets.flatten())
