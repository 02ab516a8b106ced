"""GPT-2 / GPT-3-style decoder-only transformer, as an autopipe model file.

    autopipe profile models/gpt.py -k n_layer=8
    autopipe plan models/gpt.py -k preset=gpt3-175b          # analytic: built on the meta device

Token + learned position embedding, ``n_layer`` pre-LayerNorm blocks (causal self-attention,
4x GELU MLP) in ``blocks``, a final LayerNorm and an LM head tied to the token embedding
(Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"; the sizes of the
GPT-3 presets are from Brown et al. 2020, Table 2.1). GPT-3's alternating sparse attention
is not modelled: every layer is dense. ``-k tie_embeddings=False`` gives the LM head its own
weight (Megatron-LM's ``--untie-embeddings-and-output-weights``).

Presets (``-k preset=NAME``; explicit kwargs override its fields):

    tiny         4 layers,  128 wide,  4 heads,   64 tokens, vocab   512   (default; CPU-fast)
    gpt2        12 layers,  768 wide, 12 heads, 1024 tokens, vocab 50257   124,439,808 params
    gpt2-medium 24 layers, 1024 wide, 16 heads, 1024 tokens, vocab 50257   354,823,168 params
    gpt2-large  36 layers, 1280 wide, 20 heads, 1024 tokens, vocab 50257   774,030,080 params
    gpt2-xl     48 layers, 1600 wide, 25 heads, 1024 tokens, vocab 50257 1,557,611,200 params
    gpt3-1.3b   24 layers, 2048 wide, 16 heads, 2048 tokens, vocab 50257   ~1.3e9 params
    gpt3-175b   96 layers, 12288 wide, 96 heads, 2048 tokens, vocab 50257  ~175e9 params

(Table 2.1 lists 24 heads of size 128 for GPT-3 1.3B, which does not multiply to its
d_model = 2048; this file uses 16 heads of 128.)

Parameter counts count the tied embedding / LM-head matrix once (twice when untied).
"""

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads; n_embd must be a multiple of n_head
    n_embd: int = 128  # model width C
    vocab_size: int = 512  # token vocabulary V
    block_size: int = 64  # sequence length T (size of the position table and of example batches)
    dropout: float = 0.0  # dropout on embeddings, attention probabilities and residual branches
    tie_embeddings: bool = True  # the LM head shares the token embedding's (V, C) weight

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer (got {value!r}); pass e.g. -k {name}=8")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd must be a multiple of n_head (n_embd: {self.n_embd}, n_head: {self.n_head}); "
                "change one of them"
            )
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1) (got {self.dropout!r})")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"tie_embeddings must be True or False (got {self.tie_embeddings!r})")


PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(),
    "gpt2": GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024),
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024, vocab_size=50257, block_size=1024),
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280, vocab_size=50257, block_size=1024),
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600, vocab_size=50257, block_size=1024),
    "gpt3-1.3b": GPTConfig(n_layer=24, n_head=16, n_embd=2048, vocab_size=50257, block_size=2048),
    "gpt3-175b": GPTConfig(n_layer=96, n_head=96, n_embd=12288, vocab_size=50257, block_size=2048),
}


def make_config(
    preset: str = "tiny",
    n_layer: int | None = None,
    n_head: int | None = None,
    n_embd: int | None = None,
    vocab_size: int | None = None,
    block_size: int | None = None,
    dropout: float | None = None,
    tie_embeddings: bool | None = None,
) -> GPTConfig:
    """The preset's config with every argument that is not None put in its place."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    overrides: dict[str, Any] = {
        "n_layer": n_layer,
        "n_head": n_head,
        "n_embd": n_embd,
        "vocab_size": vocab_size,
        "block_size": block_size,
        "dropout": dropout,
        "tie_embeddings": tie_embeddings,
    }
    return replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)  # q, k, v in one matmul
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, C)
        C, heads = self.n_embd, (self.n_head, self.n_embd // self.n_head)
        qkv = self.c_attn(x)  # (B, T, 3C)
        q = qkv[..., :C].unflatten(-1, heads).transpose(1, 2)  # (B, nh, T, hd)
        k = qkv[..., C : 2 * C].unflatten(-1, heads).transpose(1, 2)  # (B, nh, T, hd)
        v = qkv[..., 2 * C :].unflatten(-1, heads).transpose(1, 2)  # (B, nh, T, hd)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, nh, T, hd)
        y = y.transpose(1, 2).flatten(2)  # (B, T, C)
        out: Tensor = self.resid_dropout(self.c_proj(y))
        return out  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, C)
        out: Tensor = self.dropout(self.c_proj(self.gelu(self.c_fc(x))))
        return out  # (B, T, C)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, C)
        x = x + self.attn(self.ln_1(x))
        out: Tensor = x + self.mlp(self.ln_2(x))
        return out  # (B, T, C)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token embedding
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)  # position embedding
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # tied: one (V, C) parameter
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2: N(0, 0.02), zero biases; residual projections scaled by 1/sqrt(2 * n_layer).
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=residual_std)

    def forward(self, idx: Tensor) -> Tensor:  # idx: (B, T) int64, T <= block_size
        pos = torch.arange(idx.size(1), device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        logits: Tensor = self.lm_head(self.ln_f(x))
        return logits  # (B, T, V)


def build_model(
    preset: str = "tiny",
    n_layer: int | None = None,
    n_head: int | None = None,
    n_embd: int | None = None,
    vocab_size: int | None = None,
    block_size: int | None = None,
    dropout: float | None = None,
    tie_embeddings: bool | None = None,
) -> GPT:
    """A randomly initialised GPT; any argument left None comes from the preset."""
    return GPT(make_config(preset, n_layer, n_head, n_embd, vocab_size, block_size, dropout, tie_embeddings))


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
