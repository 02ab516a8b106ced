"""What a built decoder says about its own definition, in the units Megatron-LM's arguments use.

Tests: tests/config/test_megatron.py

:func:`read_model` reads a model (built on the meta device is enough) in two ways, the first
that answers wins: a configuration object on the model (``model.config``, as Hugging Face
models and the bundled ``models/gpt.py`` and ``models/llama.py`` carry; the attribute names of
both spellings), then the modules themselves: the token embedding (the largest
``nn.Embedding``: vocabulary and hidden size), a second embedding (learned positions), the
first layer's norms (``LayerNorm`` or an ``RMSNorm`` class), its projections (``nn.Linear``, or
GPT-2's ``Conv1D``: the FFN width; a gate beside the up projection is SwiGLU), an output layer
that shares the embedding's weight (tied). What neither answers stays ``None`` and is named in
:attr:`ModelFacts.unread`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from torch import nn

__all__ = ["ModelFacts", "read_model"]

_NAMES: dict[str, tuple[str, ...]] = {  # the config attributes, Hugging Face's and the bundled models' spellings
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "query_groups": ("num_key_value_heads", "n_kv_head", "n_kv_heads"),
    "ffn": ("intermediate_size", "ffn_hidden", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
    "max_positions": ("max_position_embeddings", "n_positions"),
    "seq_length": ("block_size", "n_ctx", "max_position_embeddings", "n_positions"),
}


@dataclass(frozen=True)
class ModelFacts:
    """A decoder's definition; ``None`` where the model did not say."""

    num_layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    query_groups: int | None = None  # key/value heads (grouped-query attention)
    ffn: int | None = None
    vocab: int | None = None
    seq_length: int | None = None
    max_positions: int | None = None
    normalization: str | None = None  # "LayerNorm" or "RMSNorm"
    activation: str | None = None  # "gelu", "swiglu" or "squared_relu"
    position: str | None = None  # "learned_absolute" or "rope"
    tied: bool | None = None  # the output layer shares the token embedding's weight
    bias: bool | None = None  # the layers' linear layers have biases

    @property
    def unread(self) -> tuple[str, ...]:
        """The fields the model did not answer, by name."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is None)


def _config_int(config: Any, key: str) -> int | None:
    for name in _NAMES[key]:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _first_layer(model: nn.Module, container: str) -> nn.Module | None:
    try:
        layers = model.get_submodule(container)
    except AttributeError:
        return None
    return next(iter(layers.children()), None)


def _projections(layer: nn.Module) -> list[tuple[int, int, bool]]:
    """(in, out, has a bias) of the layer's projections: ``nn.Linear``, and Hugging Face's
    ``Conv1D`` (GPT-2's, whose weight is stored (in, out))."""
    out = []
    for m in layer.modules():
        if isinstance(m, nn.Linear):
            out.append((m.in_features, m.out_features, m.bias is not None))
            continue
        weight = getattr(m, "weight", None)
        if type(m).__name__ == "Conv1D" and isinstance(weight, nn.Parameter) and weight.dim() == 2:
            out.append((int(weight.shape[0]), int(weight.shape[1]), getattr(m, "bias", None) is not None))
    return out


def _layer_facts(layer: nn.Module | None, hidden: int | None) -> dict[str, Any]:
    """Norm, activation, FFN width and bias from the first layer's modules."""
    if layer is None:
        return {}
    out: dict[str, Any] = {}
    norms = {type(m).__name__ for m in layer.modules() if "norm" in type(m).__name__.lower()}
    if norms and all("rms" in n.lower() for n in norms):
        out["normalization"] = "RMSNorm"
    elif norms and all(n == "LayerNorm" for n in norms):
        out["normalization"] = "LayerNorm"
    linears = _projections(layer)
    if linears:
        out["bias"] = all(bias for _, _, bias in linears)
    if hidden is not None:
        widths = [o for i, o, _ in linears if i == hidden]
        down = [i for i, o, _ in linears if o == hidden and i > hidden]
        if down:
            out["ffn"] = max(down)  # the down projection: FFN width -> hidden
            gated = sum(w == out["ffn"] for w in widths) >= 2  # gate and up projections side by side
            gelu = any(isinstance(m, nn.GELU) for m in layer.modules())
            out["activation"] = "swiglu" if gated else "gelu" if gelu else None
    return out


def _embeddings(model: nn.Module) -> tuple[nn.Embedding | None, nn.Embedding | None]:
    """The token embedding (the largest) and, if there is one, a learned position table."""
    tables = sorted(
        (m for m in model.modules() if isinstance(m, nn.Embedding)), key=lambda m: m.num_embeddings, reverse=True
    )
    token = tables[0] if tables else None
    position = next((m for m in tables[1:] if token is not None and m.embedding_dim == token.embedding_dim), None)
    return token, position


def read_model(model: nn.Module, container: str, seq_length: int | None = None) -> ModelFacts:
    """The definition of ``model``, whose layers are the module list ``container``;
    ``seq_length`` is the example inputs' sequence length when the caller knows it."""
    config = getattr(model, "config", None)
    token, position = _embeddings(model)
    hidden = _config_int(config, "hidden") or (token.embedding_dim if token is not None else None)
    layer = _first_layer(model, container)
    layers = model.get_submodule(container) if layer is not None else None
    found = _layer_facts(layer, hidden)
    act = str(getattr(config, "hidden_act", getattr(config, "activation_function", "")) or "").lower()
    if act in ("silu", "swish") and found.get("activation") == "swiglu":
        found["activation"] = "swiglu"
    elif act.startswith("gelu"):
        found["activation"] = "gelu"
    elif act in ("relu2", "squared_relu") and not found.get("activation"):
        found["activation"] = "squared_relu"  # Nemotron-4's: relu(x) ** 2 between two projections
    rope = any(getattr(config, n, None) is not None for n in ("rope_theta", "rotary_dim", "rope_scaling"))
    pos = "learned_absolute" if position is not None else "rope" if rope else None
    heads = _config_int(config, "heads")
    seq = seq_length or _config_int(config, "seq_length")
    max_positions = position.num_embeddings if position is not None else _config_int(config, "max_positions")
    tied = None
    if token is not None:
        heads_out = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == token.num_embeddings]
        tied = any(m.weight is token.weight for m in heads_out) if heads_out else None
    return ModelFacts(
        num_layers=len(list(layers.children())) if layers is not None else None,
        hidden=hidden,
        heads=heads,
        query_groups=_config_int(config, "query_groups") or heads,
        ffn=_config_int(config, "ffn") or found.get("ffn"),
        vocab=_config_int(config, "vocab") or (token.num_embeddings if token is not None else None),
        seq_length=seq,
        max_positions=max_positions or (seq if pos == "rope" else None),
        normalization=found.get("normalization"),
        activation=found.get("activation"),
        position=pos,
        tied=tied,
        bias=found.get("bias"),
    )
