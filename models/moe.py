"""A mixture-of-experts decoder (DeepSeek-V3, Qwen3-MoE, Mixtral), as an autopipe model file.

    autopipe profile models/moe.py                              # the tiny default, on this CPU
    autopipe plan models/moe.py -k preset=mixtral-8x7b --device h100 --gpus 32 --memory 80GB --batch-size 256

Token embedding, ``n_layer`` pre-RMSNorm decoder layers in ``layers`` (the first
``n_dense_layers`` with a dense SwiGLU, the others a mixture of experts), a final RMSNorm, an
untied LM head, and optionally ``mtp_depth`` multi-token-prediction modules in ``mtp``.

- **Attention**: ``attention="mla"`` is DeepSeek's multi-head latent attention (DeepSeek-AI
  2024, "DeepSeek-V2", Sec. 2.1): queries through a ``q_lora_rank`` bottleneck (0: a direct
  projection), keys and values from one ``kv_lora_rank`` latent, each head's query/key split
  into ``qk_nope_head_dim`` channels without position and ``qk_rope_head_dim`` rotary ones (the
  rotary key shared by all heads: the decoupled RoPE key), values of ``v_head_dim``.
  ``attention="gqa"``: grouped-query attention (Ainslie et al. 2023) of ``n_head`` query and
  ``n_kv_head`` key/value heads of ``head_dim``, with per-head RMSNorm of q and k when
  ``qk_norm`` (Qwen3). Rotary embedding (Su et al. 2021) in both; causal, fused attention.
- **Experts** (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; DeepSeekMoE, Dai et al.
  2024): a router (softmax, or DeepSeek-V3's sigmoid with a selection bias and ``route_scale``)
  picks ``top_k`` of ``n_experts`` routed experts per token; the experts' SwiGLU weights are
  *grouped*, one parameter per layer for all of them (``w_gate_up`` (E, h, 2f), ``w_down``
  (E, f, h)); ``n_shared_experts`` always-on experts are one dense SwiGLU of ``n_shared *
  expert_ffn``. Dispatch is by index, with static shapes: the (token, expert) pairs are sorted
  by expert, each expert takes up to ``capacity = ceil(capacity_factor * tokens * top_k / E)``
  of them in token order (GShard's capacity; later pairs are dropped, their output zero), its
  tokens are gathered into an (E, capacity, h) batch, one ``bmm`` per weight runs every expert
  at once with the routing weights applied inside the activation (Megatron-Core's fused
  weighted SwiGLU, :class:`WeightedSwiGLU`), and the outputs are gathered back and summed. So
  the counted FLOPs are the top-k experts' work, ``6 h f`` per routed pair (with
  ``capacity_factor`` 1 and ``tokens * top_k`` a multiple of E, exactly), never all experts',
  and the bytes saved for backward are Megatron-Core's, ``h + 3 f + 1`` elements per pair
  (:class:`Experts`); the meta device counts them as it counts a dense layer
  (``autopipe/costs/experts.py`` prices them under expert parallelism).
- **Multi-token prediction** (DeepSeek-V3, Sec. 2.2): module k (1..``mtp_depth``) joins the
  previous depth's hidden state at position i with the embedding of token i + k (RMSNorm
  both, concatenate, project), runs one more decoder layer (the MoE kind) and the shared LM
  head, and predicts token i + k + 1. The model then returns a tuple (main logits, one logits
  per depth); :func:`loss_fn` adds 0.1 times their mean cross entropy (``MTP_WEIGHT``).

Presets (``-k preset=NAME``; any field below as ``-k name=value`` overrides it):

    tiny            4 layers (1 dense),  128 wide, MLA 4 heads, 8 experts top-2 + 1 shared,
                    64 tokens, vocab 512, 1 MTP module  (default; CPU-fast)
    deepseek-v3    61 layers (3 dense), 7168 wide, MLA 128 heads (q_lora 1536, kv_lora 512,
                    qk 128 + 64 rope, v 128), 256 experts top-8 of 2048 + 1 shared, dense ffn
                    18432, vocab 129280, sigmoid routing (scale 2.5), 1 MTP module, 4096 tokens
    qwen3-235b-a22b 94 layers, 4096 wide, GQA 64/4 heads of 128 with q/k norm, 128 experts
                    top-8 of 1536, no shared expert, vocab 151936, 4096 tokens
    mixtral-8x7b   32 layers, 4096 wide, GQA 32/8 heads of 128, 8 experts top-2 of 14336,
                    vocab 32000, 4096 tokens

Sources: DeepSeek-V3, ``inference/configs/config_671B.json`` of github.com/deepseek-ai/DeepSeek-V3
(commit 9b4e978) and its ``README_WEIGHTS.md`` (one MTP module; 671B main-model parameters,
11.5B unique MTP ones); Qwen3-235B-A22B, ``Qwen3MoEModelProvider235B_A22B`` and Mixtral 8x7B,
``MixtralModelProvider`` of NVIDIA-NeMo/Megatron-Bridge (``src/megatron/bridge/models/qwen/
qwen_provider.py``, ``mixtral/mixtral_provider.py``), each naming its Hugging Face card. The
presets count 671.0B + 11.7B (DeepSeek-V3: main model + MTP module, the MTP sharing the
embedding and head), 235.1B (Qwen3) and 46.7B (Mixtral) parameters (``tests/test_moe_model.py``).
Not modelled, as they change no FLOP or byte the planner prices: DeepSeek's group-limited
routing and YaRN rotary scaling, auxiliary balance losses, the aux-loss-free bias update.
The sequence length ``block_size`` is the training length (4096 for all three presets).
"""

from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class MoEConfig:
    n_layer: int = 4  # decoder layers (MTP modules not included)
    n_embd: int = 128  # model width h
    vocab_size: int = 512  # token vocabulary V
    block_size: int = 64  # sequence length T (rotary tables, example batches)
    attention: str = "mla"  # "mla" (multi-head latent) or "gqa" (grouped-query)
    n_head: int = 4  # query heads
    n_kv_head: int | None = None  # gqa: key/value heads (None: n_head); mla: n_head
    head_dim: int | None = None  # gqa: per head (None: n_embd // n_head)
    qk_norm: bool = False  # gqa: RMSNorm of each q and k head (Qwen3)
    q_lora_rank: int = 64  # mla: query bottleneck; 0: queries projected directly
    kv_lora_rank: int = 32  # mla: key/value latent
    qk_nope_head_dim: int = 32  # mla: query/key channels without position
    qk_rope_head_dim: int = 16  # mla: rotary query/key channels (the key's shared by all heads)
    v_head_dim: int = 32  # mla: value channels per head
    n_dense_layers: int = 1  # leading layers with a dense SwiGLU instead of experts
    dense_ffn: int = 256  # their SwiGLU width
    n_experts: int = 8  # routed experts per MoE layer (E)
    top_k: int = 2  # routed experts per token
    expert_ffn: int = 64  # SwiGLU width of one expert (f)
    n_shared_experts: int = 1  # always-on experts (one SwiGLU of n_shared * f)
    score_func: str = "softmax"  # router: "softmax", or "sigmoid" (DeepSeek-V3)
    route_scale: float = 1.0  # routed experts' output scale (DeepSeek-V3: 2.5)
    capacity_factor: float = 1.0  # each expert takes ceil(factor * tokens * top_k / E) pairs
    mtp_depth: int = 1  # multi-token-prediction modules
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        ints = ("n_layer", "n_embd", "vocab_size", "block_size", "n_head", "kv_lora_rank", "qk_nope_head_dim")
        for name in (*ints, "qk_rope_head_dim", "v_head_dim", "dense_ffn", "n_experts", "top_k", "expert_ffn"):
            _check_int(name, getattr(self, name), 1)
        for name in ("q_lora_rank", "n_dense_layers", "n_shared_experts", "mtp_depth"):
            _check_int(name, getattr(self, name), 0)
        for name in ("n_kv_head", "head_dim"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        if self.attention not in ("mla", "gqa"):
            raise ValueError(f"attention must be 'mla' or 'gqa' (got {self.attention!r})")
        if self.score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func must be 'softmax' or 'sigmoid' (got {self.score_func!r})")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed n_experts ({self.n_experts})")
        if self.n_dense_layers > self.n_layer:
            raise ValueError(f"n_dense_layers ({self.n_dense_layers}) cannot exceed n_layer ({self.n_layer})")
        if not (isinstance(self.capacity_factor, (int, float)) and 0 < self.capacity_factor <= 64):
            raise ValueError(f"capacity_factor must be a number in (0, 64] (got {self.capacity_factor!r})")
        if self.attention == "gqa":
            if self.head_dim is None and self.n_embd % self.n_head:
                raise ValueError(
                    f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head}); or give head_dim"
                )
            if self.n_head % self.kv_heads or self.gqa_head_dim % 2:
                raise ValueError(
                    f"n_kv_head must divide n_head and head_dim be even (n_head: {self.n_head}, "
                    f"n_kv_head: {self.kv_heads}, head_dim: {self.gqa_head_dim})"
                )
        elif self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (got {self.qk_rope_head_dim})")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head if self.attention == "gqa" else self.n_head

    @property
    def gqa_head_dim(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim if self.attention == "mla" else self.gqa_head_dim


def _check_int(name: str, value: object, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{name} must be an integer >= {least} (got {value!r}); pass e.g. -k {name}=8")


_DEEPSEEK_V3 = MoEConfig(
    n_layer=61,
    n_embd=7168,
    vocab_size=129280,
    block_size=4096,
    n_head=128,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_dense_layers=3,
    dense_ffn=18432,
    n_experts=256,
    top_k=8,
    expert_ffn=2048,
    n_shared_experts=1,
    score_func="sigmoid",
    route_scale=2.5,
    mtp_depth=1,
)
_GQA = MoEConfig(attention="gqa", n_embd=4096, block_size=4096, head_dim=128, n_dense_layers=0, mtp_depth=0)
PRESETS: dict[str, MoEConfig] = {
    "tiny": MoEConfig(),
    "deepseek-v3": _DEEPSEEK_V3,
    "qwen3-235b-a22b": replace(
        _GQA,
        n_layer=94,
        vocab_size=151936,
        n_head=64,
        n_kv_head=4,
        qk_norm=True,
        n_experts=128,
        top_k=8,
        expert_ffn=1536,
        n_shared_experts=0,
        rope_theta=1e6,
    ),
    "mixtral-8x7b": replace(
        _GQA,
        n_layer=32,
        vocab_size=32000,
        n_head=32,
        n_kv_head=8,
        n_experts=8,
        top_k=2,
        expert_ffn=14336,
        n_shared_experts=0,
        norm_eps=1e-5,
        rope_theta=1e6,
    ),
}
_FIELDS = tuple(f.name for f in fields(MoEConfig))


def make_config(preset: str = "tiny", **overrides: Any) -> MoEConfig:
    """The preset's config with every override that is not None put in its place."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    unknown = sorted(set(overrides) - set(_FIELDS))
    if unknown:  # a TypeError, as for a keyword argument a function does not take
        raise TypeError(f"models/moe.py has no setting {unknown[0]!r}; use one of: {', '.join(_FIELDS)}")
    return replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})


class FusedRMSNorm(torch.autograd.Function):
    """``x / rms(x) * weight``, computed in fp32, saving for backward only its input and the fp32
    reciprocal of each row's RMS: Transformer Engine's RMSNorm, which Megatron-Core runs
    (``TENorm``; ``transformer_engine/pytorch/module/rmsnorm.py`` saves ``inp, weight, rsigma``),
    not eager autograd's fp32 copies of the input and the normalised rows."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd).type_as(x) * weight

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.float() * rstd
        g = grad.float() * weight.float()
        dx = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        dweight = (grad.float() * normed).flatten(0, -2).sum(0)
        return dx.type_as(x), dweight.type_as(weight), None


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
        return rms_norm(x, self.weight, self.eps)


def rotary_tables(dim: int, length: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of position * theta^(-2i/dim), each (length, dim), halves repeated; computed
    on the CPU and put on the device the model is built on (meta: shapes only)."""
    inv_freq = theta ** -(torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)  # (dim/2,)
    angles = torch.outer(torch.arange(length, dtype=torch.float32, device="cpu"), inv_freq)  # (T, dim/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, dim)
    here = torch.empty(0).device
    return angles.cos().to(here), angles.sin().to(here)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (i, i + d/2) of x (B, heads, T, d) by the position angles (T, d)."""
    half = x.size(-1) // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    cos: Tensor
    sin: Tensor

    def __init__(self, cfg: MoEConfig, cos: Tensor, sin: Tensor) -> None:
        super().__init__()
        h, heads = cfg.n_embd, cfg.n_head
        self.heads, self.nope, self.rope, self.v_dim = heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.kv_rank = cfg.kv_lora_rank
        qk = self.nope + self.rope
        if cfg.q_lora_rank:
            self.wq_a = nn.Linear(h, cfg.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.wq_b = nn.Linear(cfg.q_lora_rank, heads * qk, bias=False)
        else:
            self.wq = nn.Linear(h, heads * qk, bias=False)
        self.wkv_a = nn.Linear(h, cfg.kv_lora_rank + self.rope, bias=False)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg.norm_eps)
        self.wkv_b = nn.Linear(cfg.kv_lora_rank, heads * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(heads * self.v_dim, h, bias=False)
        self.register_buffer("cos", cos, persistent=False)  # (block_size, rope), shared
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, h)
        b, t = x.size(0), x.size(1)
        cos, sin = self.cos.narrow(0, 0, t), self.sin.narrow(0, 0, t)
        q = self.wq_b(self.q_norm(self.wq_a(x))) if hasattr(self, "wq_a") else self.wq(x)
        q = q.unflatten(-1, (self.heads, self.nope + self.rope)).transpose(1, 2)  # (B, H, T, dn + dr)
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        latent, k_pe = self.wkv_a(x).split([self.kv_rank, self.rope], dim=-1)  # (B, T, r), (B, T, dr)
        kv = self.wkv_b(self.kv_norm(latent)).unflatten(-1, (self.heads, self.nope + self.v_dim)).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)  # (B, H, T, dn), (B, H, T, dv)
        k_pe = apply_rotary(k_pe.unsqueeze(1), cos, sin).expand(b, self.heads, t, self.rope)  # one key for all heads
        q = torch.cat((q_nope, apply_rotary(q_pe, cos, sin)), dim=-1)  # (B, H, T, dn + dr)
        k = torch.cat((k_nope, k_pe), dim=-1)  # (B, H, T, dn + dr)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, dv)
        out: Tensor = self.wo(y.transpose(1, 2).flatten(2))
        return out  # (B, T, h)


class GroupedQueryAttention(nn.Module):
    cos: Tensor
    sin: Tensor

    def __init__(self, cfg: MoEConfig, cos: Tensor, sin: Tensor) -> None:
        super().__init__()
        h, self.heads, self.kv_heads, self.dim = cfg.n_embd, cfg.n_head, cfg.kv_heads, cfg.gqa_head_dim
        self.q_proj = nn.Linear(h, self.heads * self.dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.dim, h, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.dim, cfg.norm_eps)
            self.k_norm = RMSNorm(self.dim, cfg.norm_eps)
        self.register_buffer("cos", cos, persistent=False)  # (block_size, head_dim), shared
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, h)
        t = x.size(1)
        cos, sin = self.cos.narrow(0, 0, t), self.sin.narrow(0, 0, t)
        q = self.q_proj(x).unflatten(-1, (self.heads, self.dim))  # (B, T, H, d)
        k = self.k_proj(x).unflatten(-1, (self.kv_heads, self.dim))  # (B, T, Hkv, d)
        v = self.v_proj(x).unflatten(-1, (self.kv_heads, self.dim)).transpose(1, 2)  # (B, Hkv, T, d)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q.transpose(1, 2), cos, sin)  # (B, H, T, d)
        k = apply_rotary(k.transpose(1, 2), cos, sin)  # (B, Hkv, T, d)
        if self.kv_heads != self.heads:  # each key/value head serves heads / kv_heads query heads
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, d)
        out: Tensor = self.o_proj(y.transpose(1, 2).flatten(2))
        return out  # (B, T, h)


class SwiGLU(nn.Module):
    def __init__(self, h: int, ffn: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(h, ffn, bias=False)
        self.up_proj = nn.Linear(h, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, h, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # x: (..., h)
        out: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class Router(nn.Module):
    """Top-k of E experts per token: (weights (N, k), experts (N, k))."""

    bias: Tensor

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.k, self.sigmoid, self.scale = cfg.top_k, cfg.score_func == "sigmoid", cfg.route_scale
        self.weight = nn.Parameter(torch.empty(cfg.n_experts, cfg.n_embd))
        # DeepSeek-V3's aux-loss-free balance: a bias on the scores that only steers the choice.
        self.register_buffer("bias", torch.zeros(cfg.n_experts), persistent=self.sigmoid)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:  # x: (N, h)
        logits = F.linear(x, self.weight).float()  # (N, E)
        if self.sigmoid:
            scores = logits.sigmoid()
            experts = torch.topk(scores + self.bias, self.k, dim=-1)[1]  # (N, k)
            weights = scores.gather(1, experts)
        else:
            scores = logits.softmax(dim=-1)
            top = torch.topk(scores, self.k, dim=-1)
            weights, experts = top[0], top[1]
        weights = weights / weights.sum(dim=-1, keepdim=True) * self.scale
        return weights.type_as(x), experts


class WeightedSwiGLU(torch.autograd.Function):
    """``silu(gate) * up * probs`` of ``x = [gate, up]`` (..., 2f) and the routing ``probs`` (..., 1),
    saving only its two inputs for backward and recomputing the rest there: Megatron-Core's fused
    ``weighted_bias_swiglu_impl`` (``megatron/core/fusions/fused_bias_swiglu.py``,
    ``WeightedSwiGLUFunction``), which its grouped experts run with the routing probabilities
    applied inside the activation (``moe_apply_probs_on_input`` off, the default), so the combine
    after them is a plain un-permute that keeps nothing but indices."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, probs: Tensor) -> Tensor:
        ctx.save_for_backward(x, probs)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up * probs

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        x, probs = ctx.saved_tensors
        gate, up = x.chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        weighted = grad * probs
        d_gate = weighted * up * sig * (1 + gate * (1 - sig))
        d_probs = (grad * silu * up).sum(dim=-1, keepdim=True)
        return torch.cat((d_gate, weighted * silu), dim=-1), d_probs


def weighted_swiglu(x: Tensor, probs: Tensor) -> Tensor:  # x: (..., 2f), probs: (..., 1)
    out: Tensor = WeightedSwiGLU.apply(x, probs)
    return out


torch.fx.wrap("weighted_swiglu")  # one node in a symbolic trace: the fused kernel, not its parts


class Experts(nn.Module):
    """E SwiGLU experts as grouped weights, each run on the tokens routed to it (module docstring).

    What it keeps for backward is what Megatron-Core's alltoall dispatcher and grouped experts
    keep (``megatron/core/transformer/moe/token_dispatcher.py``, ``experts.py``): per routed
    (token, expert) pair the expert's input (h, saved by the first grouped GEMM), the activation's
    input (2f) and the pair's routing probability (the fused weighted SwiGLU), the second GEMM's
    input (f); the dispatch and combine are index gathers, which keep only their indices."""

    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.E, self.k, self.f = cfg.n_experts, cfg.top_k, cfg.expert_ffn
        ratio = Fraction(cfg.capacity_factor).limit_denominator(1000)
        self.cap_num, self.cap_den = ratio.numerator, ratio.denominator
        self.w_gate_up = nn.Parameter(torch.empty(self.E, cfg.n_embd, 2 * self.f))  # (E, h, 2f)
        self.w_down = nn.Parameter(torch.empty(self.E, self.f, cfg.n_embd))  # (E, f, h)

    def forward(self, x: Tensor, weights: Tensor, experts: Tensor) -> Tensor:  # x: (N, h); (N, k) each
        n, h, E, k = x.size(0), x.size(1), self.E, self.k
        cap = (n * k * self.cap_num + E * self.cap_den - 1) // (E * self.cap_den)  # pairs per expert
        flat = experts.flatten()  # (N k,) the expert of each (token, choice) pair
        by_expert = torch.sort(flat, stable=True)
        chosen, order = by_expert[0], by_expert[1]  # pairs sorted by expert, token order kept
        counts = torch.zeros(E, dtype=flat.dtype, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        starts = counts.cumsum(0) - counts  # (E,) first sorted pair of each expert
        pos = torch.arange(n * k, device=x.device) - starts[chosen]  # place in its expert's queue
        slot = torch.where(pos < cap, chosen * cap + pos, E * cap)  # E * cap: dropped
        pair = torch.full((E * cap + 1,), n * k, dtype=flat.dtype, device=x.device)  # n k: the zero row
        pair = pair.scatter(0, slot, order)[: E * cap]  # (E C,) the pair in each slot
        token = torch.where(pair < n * k, torch.div(pair, k, rounding_mode="floor"), n)  # n: the zero row
        rows = torch.cat((x, x.new_zeros(1, h)))[token].view(E, cap, h)  # (E, C, h) dispatch
        probs = torch.cat((weights.flatten(), weights.new_zeros(1)))[pair].view(E, cap, 1)  # (E, C, 1)
        act = weighted_swiglu(torch.bmm(rows, self.w_gate_up), probs)  # (E, C, f)
        out = torch.bmm(act, self.w_down).view(E * cap, h)  # (E C, h)
        pair_slot = torch.empty_like(slot).scatter(0, order, slot)  # (N k,) slot of each pair
        back = torch.cat((out, out.new_zeros(1, h)))[pair_slot]  # (N k, h) combine: un-permute
        return back.view(n, k, h).sum(dim=1)  # (N, h)


class MoE(nn.Module):
    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.router = Router(cfg)
        self.experts = Experts(cfg)
        if cfg.n_shared_experts:
            self.shared = SwiGLU(cfg.n_embd, cfg.n_shared_experts * cfg.expert_ffn)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, h)
        flat = x.flatten(0, 1)  # (N, h)
        weights, experts = self.router(flat)
        y = self.experts(flat, weights, experts)
        if hasattr(self, "shared"):
            y = y + self.shared(flat)
        return y.view_as(x)  # (B, T, h)


class DecoderLayer(nn.Module):
    """x + attn(norm(x)), then x + ffn(norm(x)) with a dense SwiGLU or a mixture of experts."""

    def __init__(self, cfg: MoEConfig, cos: Tensor, sin: Tensor, dense: bool) -> None:
        super().__init__()
        attention = LatentAttention if cfg.attention == "mla" else GroupedQueryAttention
        self.attn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attn = attention(cfg, cos, sin)
        self.ffn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.ffn: nn.Module = SwiGLU(cfg.n_embd, cfg.dense_ffn) if dense else MoE(cfg)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, h)
        x = x + self.attn(self.attn_norm(x))
        out: Tensor = x + self.ffn(self.ffn_norm(x))
        return out


class MTPModule(nn.Module):
    """One multi-token-prediction depth: h' = layer(proj([norm(h_i); norm(emb(t_{i+k}))]))."""

    def __init__(self, cfg: MoEConfig, cos: Tensor, sin: Tensor) -> None:
        super().__init__()
        self.hnorm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.enorm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.proj = nn.Linear(2 * cfg.n_embd, cfg.n_embd, bias=False)
        self.layer = DecoderLayer(cfg, cos, sin, dense=cfg.n_dense_layers >= cfg.n_layer)

    def forward(self, hidden: Tensor, embedded: Tensor) -> Tensor:  # (B, T - k, h) each
        return self.layer(self.proj(torch.cat((self.hnorm(hidden), self.enorm(embedded)), dim=-1)))


class MoEDecoder(nn.Module):
    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.config = cfg
        cos, sin = rotary_tables(cfg.rope_dim, cfg.block_size, cfg.rope_theta)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(DecoderLayer(cfg, cos, sin, i < cfg.n_dense_layers) for i in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.mtp = nn.ModuleList(MTPModule(cfg, cos, sin) for _ in range(cfg.mtp_depth))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, (Router, Experts)):
                for p in module.parameters(recurse=False):
                    nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor | tuple[Tensor, ...]:  # idx: (B, T) int64, T <= block_size
        x = self.embed_tokens(idx)  # (B, T, h)
        for layer in self.layers:
            x = layer(x)
        logits: Tensor = self.lm_head(self.norm(x))  # (B, T, V)
        if not len(self.mtp):
            return logits
        out, hidden = [logits], x
        for k, module in enumerate(self.mtp, start=1):
            hidden = module(hidden.narrow(1, 0, idx.size(1) - k), self.embed_tokens(idx.narrow(1, k, idx.size(1) - k)))
            out.append(self.lm_head(self.norm(hidden)))  # (B, T - k, V): token i + k + 1
        return tuple(out)


def build_model(preset: str = "tiny", **overrides: Any) -> MoEDecoder:
    """A randomly initialised MoE decoder; any setting not given comes from the preset."""
    return MoEDecoder(make_config(preset, **overrides))


def _tokens(batch_size: int, cfg: MoEConfig) -> Tensor:
    """A fixed (B, T + 1) token sequence: inputs are [:, :-1], next-token targets [:, 1:]."""
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size + 1), generator=g, device="cpu")
    return seq.to(torch.get_default_device())


def example_inputs(batch_size: int, preset: str = "tiny", **overrides: Any) -> Tensor:
    return _tokens(batch_size, make_config(preset, **overrides))[:, :-1]  # (B, T) int64


def example_targets(batch_size: int, preset: str = "tiny", **overrides: Any) -> Tensor:
    return _tokens(batch_size, make_config(preset, **overrides))[:, 1:]  # (B, T) next tokens


def loss_fn(output: Tensor | tuple[Tensor, ...], targets: Tensor) -> Tensor:
    """Next-token cross entropy; with MTP, plus 0.1 x the mean over depths k of the cross
    entropy of token i + k + 1 (targets[:, k:]) (DeepSeek-V3, Sec. 2.2)."""
    logits = output if isinstance(output, Tensor) else output[0]
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    if isinstance(output, tuple) and len(output) > 1:
        extra = [F.cross_entropy(o.flatten(0, 1), targets[:, k:].flatten()) for k, o in enumerate(output[1:], 1)]
        loss = loss + MTP_WEIGHT * torch.stack(extra).mean()
    return loss


MTP_WEIGHT = 0.1  # the loss weight of the MTP modules (Megatron-Bridge's DeepSeek-V3 recipe: 0.1)
