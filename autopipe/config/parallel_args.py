"""Expert and context parallelism, and a MoE decoder's own definition, in the frameworks' words.

Tests: tests/config/test_parallel_args.py.

Guarded by the plan's fields, which default to 1 (``Plan.expert_parallel``,
``expert_tensor_parallel``, ``context_parallel``): a plan without them, or a dense model's,
gets no line from here, so every output written before stays as it was.

- **Megatron-LM** (Megatron-Core's MoE and context parallelism, ``megatron/training/arguments.py``):
  ``--context-parallel-size`` with ``--cp-comm-type p2p`` (the ring autopipe prices); for a
  model with routed experts ``--num-experts``, ``--overlap-moe-expert-parallel-comm`` where the plan
  hides the all-to-all (``Overlap.expert_comm``, interleaved 1F1B), ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
  ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size`` (Megatron's default is t;
  the plan's is written), ``--moe-layer-freq`` where some layers are dense (a Python list
  expression, ``([0]*3+[1]*58)``), ``--moe-shared-expert-intermediate-size`` for shared
  experts, ``--moe-router-score-function sigmoid`` and ``--moe-router-topk-scaling-factor``
  where the router says so, the all-to-all dispatcher and grouped GEMMs autopipe priced
  (``--moe-token-dispatcher-type alltoall --moe-grouped-gemm``); multi-head latent attention
  (``--multi-latent-attention`` with its ranks and head sizes), ``--qk-layernorm`` and
  ``--mtp-num-layers`` where the model has them. The layout string stays ``t`` per layer
  (Megatron picks a layer's MoE or dense MLP from ``--moe-layer-freq``), with an ``m`` per MTP
  layer before the loss (``config/megatron.py``'s ``layout_string``).
- **torchtitan** (``[parallelism]`` of ``torchtitan/config/job_config.py``):
  ``context_parallel_degree``, ``expert_parallel_degree``, ``expert_tensor_parallel_degree``;
  torchtitan forms the expert-parallel group from the FSDP-sharded and context-parallel ranks,
  so a note says when ``ep`` does not divide them.

The MoE facts come from the built model (:func:`read_moe`): E and k from its config, which
layers hold routed experts and one expert's width from the expert weights (grouped ``(E, ., .)``
weights, or a list of E numbered experts: what ``costs.experts`` prices, read here again as
config/ reads modules, not costs), the shared experts from a ``shared*`` module beside them, sigmoid routing
from the config (``scoring_func``, ``score_func``) or a score-correction bias (Hugging Face's
DeepSeek-V3), multi-token prediction from the model's own ``mtp`` modules (what the plan
priced: Hugging Face's DeepSeek-V3 config names one its model never builds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch import nn

from autopipe.config.parts import Degrees

__all__ = ["MoEFacts", "layer_freq", "megatron_parallel_args", "read_moe", "titan_parallel_lines"]


@dataclass(frozen=True)
class MoEFacts:
    """A MoE decoder's definition, in the units Megatron's MoE arguments use."""

    experts: int  # E: routed experts per MoE layer
    top_k: int  # k
    ffn: int  # one routed expert's SwiGLU width
    moe_layers: tuple[bool, ...]  # per layer of the layer list: routed experts (True) or a dense MLP
    shared_ffn: int = 0  # the shared experts' width in all (0: none)
    score: str = "softmax"  # the router's scores: "softmax" or "sigmoid"
    scale: float = 1.0  # the routed experts' output scale
    mla: tuple[int, int, int, int, int] | None = None  # q_lora, kv_lora, qk_nope, qk_rope, v head sizes
    mtp_layers: int = 0
    qk_norm: bool = False


_EXPERTS = ("n_routed_experts", "num_local_experts", "num_experts", "n_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "top_k", "moe_top_k", "moe_router_topk", "n_activated_experts")
_LISTED = re.compile(r"(?:^|\.)experts\.(\d+)\.")  # experts kept as a ModuleList: experts.<i>.w1 ...


def _get(config: Any, *names: str) -> Any:
    return next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)


def _count(config: Any, names: tuple[str, ...]) -> int | None:
    v = _get(config, *names)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _expert_weights(layer: nn.Module, experts: int) -> list[nn.Parameter]:
    """The layer's routed-expert weights: grouped ``(E, ., .)`` ones, or those of E numbered experts."""
    named = list(layer.named_parameters())
    found: dict[str, set[str]] = {}
    for name, _ in named:
        if m := _LISTED.search(name):
            found.setdefault(name[: m.start()], set()).add(m.group(1))
    listed = {prefix for prefix, ids in found.items() if len(ids) == experts}
    out = []
    for name, p in named:
        m = _LISTED.search(name)
        if (p.dim() >= 3 and p.shape[0] == experts) or (m is not None and name[: m.start()] in listed):
            out.append(p)
    return out


def _shared_width(layer: nn.Module, hidden: int) -> int:
    """The width of a ``shared*`` MLP in ``layer``: its down projection's input."""
    for name, m in layer.named_modules():
        if name.rsplit(".", 1)[-1].startswith("shared") and not name.endswith("gate"):
            downs = [x.in_features for x in m.modules() if isinstance(x, nn.Linear) and x.out_features == hidden]
            if downs:
                return downs[0]
    return 0


def read_moe(model: nn.Module, container: str) -> MoEFacts | None:
    """The MoE definition of ``model`` (layers in the module list ``container``); None for a
    model without routed experts."""
    config = getattr(model, "config", None)
    experts, k = _count(config, _EXPERTS), _count(config, _TOP_K)
    if experts is None or k is None or experts < 2:
        return None
    try:
        layers = list(model.get_submodule(container).children())
    except AttributeError:
        return None
    hidden = _get(config, "hidden_size", "n_embd", "dim")
    per_layer = [_expert_weights(layer, experts) for layer in layers]
    widths = [d for ps in per_layer for p in ps for d in p.shape[1:] if d != hidden]
    if not widths or not isinstance(hidden, int):
        return None
    moe_layers = tuple(bool(ps) for ps in per_layer)
    first = layers[moe_layers.index(True)]
    mla = None
    if _get(config, "kv_lora_rank") and _get(config, "qk_rope_head_dim") and _get(config, "attention") != "gqa":
        mla = (
            int(_get(config, "q_lora_rank") or 0),
            int(_get(config, "kv_lora_rank")),
            int(_get(config, "qk_nope_head_dim")),
            int(_get(config, "qk_rope_head_dim")),
            int(_get(config, "v_head_dim")),
        )
    names = {n.rsplit(".", 1)[-1] for n, _ in first.named_modules()}
    biased = any(n.endswith("e_score_correction_bias") for n, _ in first.named_buffers())  # HF's DeepSeek-V3
    return MoEFacts(
        experts=experts,
        top_k=k,
        ffn=min(widths),  # gate and up may be one (E, h, 2f) weight: the down projection's f is the smaller
        moe_layers=moe_layers,
        shared_ffn=_shared_width(first, hidden),
        score=str(_get(config, "scoring_func", "score_func") or ("sigmoid" if biased else "softmax")),
        scale=float(_get(config, "routed_scaling_factor", "route_scale") or 1.0),
        mla=mla,
        mtp_layers=len(getattr(model, "mtp", ())),  # modules the plan priced (HF's configs name some it never builds)
        qk_norm=mla is None and {"q_norm", "k_norm"} <= names,
    )


def layer_freq(moe_layers: tuple[bool, ...]) -> str | None:
    """Megatron's ``--moe-layer-freq`` for the pattern: runs as ``([0]*3+[1]*58)``; None when
    every layer is MoE (Megatron's default, 1)."""
    if all(moe_layers):
        return None
    runs: list[list[int]] = []
    for flag in (int(x) for x in moe_layers):
        if runs and runs[-1][0] == flag:
            runs[-1][1] += 1
        else:
            runs.append([flag, 1])
    return "(" + "+".join(f"[{flag}]*{n}" for flag, n in runs) + ")"


def _moe_args(facts: MoEFacts, deg: Degrees) -> list[str]:
    args = [
        "--num-experts",
        str(facts.experts),
        "--moe-router-topk",
        str(facts.top_k),
        "--moe-ffn-hidden-size",
        str(facts.ffn),
        "--expert-model-parallel-size",
        str(deg.expert),
        "--expert-tensor-parallel-size",
        str(deg.expert_tensor),
        "--moe-token-dispatcher-type",
        "alltoall",
        "--moe-grouped-gemm",
    ]
    freq = layer_freq(facts.moe_layers)
    args += ["--moe-layer-freq", freq] if freq else []
    args += ["--moe-shared-expert-intermediate-size", str(facts.shared_ffn)] if facts.shared_ffn else []
    if facts.score == "sigmoid":
        args += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias"]
    args += ["--moe-router-topk-scaling-factor", f"{facts.scale:g}"] if facts.scale != 1.0 else []
    if facts.mla is not None:
        q, kv, nope, rope, v = facts.mla
        args += ["--multi-latent-attention", *(["--q-lora-rank", str(q)] if q else [])]
        args += ["--kv-lora-rank", str(kv), "--qk-head-dim", str(nope), "--qk-pos-emb-head-dim", str(rope)]
        args += ["--v-head-dim", str(v)]
    args += ["--qk-layernorm"] if facts.qk_norm else []
    args += ["--mtp-num-layers", str(facts.mtp_layers)] if facts.mtp_layers else []
    return args


def megatron_parallel_args(deg: Degrees, facts: MoEFacts | None) -> tuple[list[str], list[str]]:
    """Megatron-LM's context- and expert-parallel arguments, and the MoE model's own; notes."""
    args: list[str] = []
    notes: list[str] = []
    if deg.context > 1:
        args += ["--context-parallel-size", str(deg.context), "--cp-comm-type", "p2p"]
    if facts is not None:
        args += _moe_args(facts, deg)
        if deg.expert_overlap:  # priced with the all-to-all under the other micro-batch (interleaved 1F1B)
            args.append("--overlap-moe-expert-parallel-comm")
        if deg.tensor > 1 and not deg.sequence_parallel:
            notes.append("Megatron-Core needs --sequence-parallel for MoE layers with tensor parallelism (t > 1)")
    elif deg.expert > 1 or deg.expert_tensor > 1:
        notes.append(
            f"the plan asks for expert parallelism ({deg.expert} x {deg.expert_tensor}) but no routed experts were "
            "read from the model: add --num-experts, --moe-router-topk and --moe-ffn-hidden-size as your model has them"
        )
    return args, notes


def titan_parallel_lines(deg: Degrees, shard: int) -> tuple[list[str], list[str]]:
    """torchtitan's ``[parallelism]`` lines for context and expert parallelism (none at 1), and
    notes; ``shard``: the job's ``data_parallel_shard_degree``."""
    lines = []
    if deg.context > 1:
        lines.append(f"context_parallel_degree = {deg.context}")
    if deg.expert > 1 or deg.expert_tensor > 1:
        lines += [f"expert_parallel_degree = {deg.expert}", f"expert_tensor_parallel_degree = {deg.expert_tensor}"]
    notes = []
    if deg.expert > 1 and (shard * deg.context) % deg.expert:
        notes.append(
            f"torchtitan forms the expert-parallel group of {deg.expert} from the FSDP-sharded and context-parallel "
            f"ranks ({shard} x {deg.context} here): shard the data-parallel ranks (data_parallel_shard_degree) "
            "so that ep divides them"
        )
    if deg.expert_tensor not in (1, deg.tensor):
        notes.append(f"torchtitan's expert tensor parallelism is 1 or t ({deg.tensor}), not {deg.expert_tensor}")
    return lines, notes
