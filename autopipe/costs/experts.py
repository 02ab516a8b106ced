"""Mixture-of-experts layers under expert parallelism (EP), priced from a block's counted ops.

A MoE layer (Shazeer et al. 2017; GShard, Lepikhin et al. 2020) routes each token to ``k`` of
its ``E`` routed experts. Expert parallelism (GShard; Megatron-Core's MoE, whose "parallel
folding" lets the experts' layout differ from attention's) shards the experts of a layer over
an EP group of ``ep`` devices (``E / ep`` each; ``etp``, expert tensor parallelism, splits each
expert's FFN width ``etp`` ways too), so each device sends every token to the devices holding
its experts (an all-to-all *dispatch*) and gets the outputs back (*combine*). The counted ops
(``costs.counting``) already price the top-k experts' work, ``6 h f`` per routed (token,
expert) pair, never all experts'; their expert GEMMs are marked ``expert``. Per device of a
layout with tensor parallelism ``t`` (with sequence parallelism: Megatron requires it for MoE
with t > 1) and context parallelism ``cp``, for a block counted whole on ``T`` tokens:

- **Expert compute**: the device's ``T / (t cp)`` tokens send ``k`` pairs each; the EP group's
  pairs land on its ``E / ep`` local experts, ``etp`` devices sharing each. Each expert GEMM
  keeps its FLOPs share, ``flops * imbalance / (t cp)``, but its shape changes: ``E / ep``
  groups (local experts) of ``rows * ep * etp * imbalance / (t cp)`` rows each (every local
  expert serves the pairs of the whole group) and a ``1 / etp`` share of the FFN width; bytes
  are the GEMM's ideal traffic (both operands and the result) at that shape, so larger EP means
  fewer, fuller expert GEMMs that the device's efficiency curve prices better. Other marked
  ops (casts and indexing of expert weights) scale as the pairs do.
- **Imbalance**: routing is never even; the busiest device of the group runs ``imbalance``
  times the mean pairs and the others wait for it at the combine. Default
  :data:`DEFAULT_IMBALANCE` = 1.25: the room above the even share that Switch Transformers
  give each expert when they train (expert capacity factors 1.0 to 1.25 work best, Fedus et
  al. 2022, Sec. 2.2), taken as the busiest device's load; an allowance, not a measurement of
  any one run, and a device holding ``E / ep`` experts averages over them, so it is usually
  more even. A parameter: ``ExpertSplit.imbalance`` (1.0: perfectly balanced; published
  layouts are pinned at 1.0 unless their source says otherwise).
- **Parameters and optimizer state**: the routed experts' parameters ``/ (ep etp)`` per
  device (``BlockCost.expert_params``); their gradients are reduced over the *expert
  data-parallel* group, ``t cp d / (ep etp)`` devices (:func:`expert_data_parallel`), and
  their optimizer state sharded over it under a distributed optimizer; the router and the
  shared experts are dense parameters (tensor-parallel, reduced over ``d cp``).
- **All-to-all** per MoE layer and micro-batch (:func:`alltoall_s`): dispatch and combine each
  move the device's ``T k / (t cp)`` pairs of ``h`` elements; ``1 / ep`` of them stay on the
  device, ``(g - 1) / ep`` go to the ``g - 1`` other EP ranks in its node over NVLink and the
  rest cross the network, both links at once (time = the slower of the two, plus one latency
  of each link used). Uniform routing; with ``deduplicate`` (DeepEP, DeepSeek-V3 Sec. 3.2.2) a
  token crosses to a node once whatever its experts there, ``(n - 1)(1 - (1 - 1/n)^k)``
  remote nodes per token of ``n`` nodes (at most ``max_nodes``: node-limited routing), and
  is forwarded within that node over NVLink. Forward: dispatch + combine; backward: the same
  two, for the gradients. ``dispatch_bytes`` prices an FP8 dispatch (DeepSeek-V3: 1 byte).
- **Shared experts** are ordinary dense ops, priced as the layer's other ops.
- **Activations saved for backward** are the block's counted ones (``saved_tensors_hooks`` on
  the meta device, as a dense layer's), one device's share ``1 / (t cp)`` of them whatever ep
  (``degrees.device_saved``): the device's ``T / (t cp)`` tokens send ``T k / (t cp)`` pairs
  and, balanced, as many land on its ``E / ep`` experts. What a pair keeps is what the model's
  ops keep; the bundled ``models/moe.py`` keeps Megatron-Core's ``h + 3 f + 1`` elements (its
  grouped experts' inputs, the fused weighted SwiGLU's input and probability).

Not modelled: the busiest device's extra activations (saved bytes are the balanced count), the
permutation kernels' cost beyond the counted gathers, token dropping beyond the model's own.
Pure apart from :func:`moe_shape` and :func:`expert_storages`, which read a module.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from autopipe.costs.counting import OpCount

__all__ = [
    "DEFAULT_IMBALANCE",
    "ExpertSplit",
    "MoEShape",
    "alltoall_bytes",
    "alltoall_parts",
    "alltoall_s",
    "expert_data_parallel",
    "expert_degrees",
    "expert_ops",
    "expert_parameters",
    "expert_reason",
    "expert_storages",
    "moe_shape",
]

DEFAULT_IMBALANCE = 1.25  # Switch Transformers' expert capacity in training (module docstring)

_EXPERTS = ("n_routed_experts", "num_local_experts", "num_experts", "n_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "top_k", "moe_top_k", "moe_router_topk", "n_activated_experts")
_LISTED = re.compile(r"(?:^|\.)experts\.(\d+)\.")  # experts kept as a ModuleList: experts.<i>.w1 ...


@dataclass(frozen=True)
class MoEShape:
    """What expert parallelism needs to know about a model's MoE layers."""

    experts: int  # E: routed experts per MoE layer
    top_k: int  # k: routed experts per token
    hidden: int  # h: width of a dispatched token
    seq: int  # tokens per sample
    expert_params: tuple[int, ...]  # per block: routed-expert parameter elements it owns (0: none)
    moe_layers: tuple[int, ...]  # per block: MoE layers in it
    weight_dims: tuple[tuple[int, int], ...] = ()  # each expert matrix's (rows, cols), sorted; GEMM shapes

    @property
    def blocks(self) -> tuple[int, ...]:
        """Indices of the blocks holding routed experts."""
        return tuple(i for i, n in enumerate(self.moe_layers) if n)


@dataclass(frozen=True)
class ExpertSplit:
    """Degree ``ep`` (and ``etp``) of one layout, its imbalance and its links."""

    shape: MoEShape
    degree: int  # ep: devices sharing a layer's routed experts
    nvlink_bandwidth: float  # bytes/s per device, one direction, within a node
    network_bandwidth: float  # bytes/s per device, one direction, across nodes
    ranks_per_node: int = 1  # g: EP ranks in one node (the rest of the group is on other nodes)
    tensor: int = 1  # etp: expert tensor parallelism
    imbalance: float = DEFAULT_IMBALANCE  # busiest device's pairs / the mean
    link_latency_s: float = 10e-6
    network_latency_s: float = 10e-6
    dispatch_bytes: float = 0.0  # bytes per dispatched element (0: the activations' dtype)
    deduplicate: bool = False  # a token crosses to each node once (DeepEP)
    max_nodes: int = 0  # node-limited routing: a token's experts on at most this many nodes (0: any)


def expert_reason(shape: MoEShape | None, ep: int, etp: int, stage_devices: int) -> str:
    """Why ``ep`` x ``etp`` cannot be used on a pipeline stage of ``stage_devices`` = t cp d
    devices ('' when it can): Megatron-Core needs ``E`` divisible by ``ep`` and the stage's
    devices by ``ep etp`` (the experts' layout folds into the same devices as attention's)."""
    if ep < 1 or etp < 1:
        return f"expert parallel {ep} x expert tensor parallel {etp}: use whole numbers >= 1"
    if ep == 1 and etp == 1:
        return ""
    if shape is None:
        return "the model has no routed experts autopipe can find (expert parallelism needs an analytic plan of a MoE)"
    if shape.experts % ep:
        return f"{ep} does not divide the {shape.experts} experts"
    if stage_devices % (ep * etp):
        return f"expert parallel {ep} x expert tensor parallel {etp} does not divide {stage_devices} devices per stage"
    return ""


def expert_degrees(shape: MoEShape | None, stage_devices: int, etp: int = 1) -> tuple[list[int], list[tuple[int, str]]]:
    """The EP degrees to search for one pipeline stage of ``stage_devices`` devices (divisors
    of E and of the stage's devices / etp), and each skipped divisor of the stage with why."""
    if shape is None:
        return [1], []
    ok: list[int] = []
    skipped: list[tuple[int, str]] = []
    for ep in range(1, stage_devices // etp + 1):
        if (stage_devices // etp) % ep:
            continue
        why = expert_reason(shape, ep, etp, stage_devices)
        (skipped.append((ep, why)) if why else ok.append(ep))
    return ok, skipped


def expert_data_parallel(t: int, cp: int, d: int, ep: int, etp: int = 1) -> int:
    """Devices reducing one routed expert's gradients: a stage's ``t cp d`` devices over ``ep etp``."""
    return max(1, t * cp * d // (ep * etp))


# --------------------------------------------------------------------------- compute


def _token_axis(dims: tuple[float, ...], shape: MoEShape) -> int | None:
    """Which of a GEMM's (M, K, N) counts routed pairs: the one whose two others are an expert
    weight's (rows, cols); None when no expert matrix fits (the op is then scaled as a whole)."""
    pairs = set(shape.weight_dims)
    for i in range(3):
        rest = tuple(sorted(round(d) for j, d in enumerate(dims) if j != i))
        if rest in pairs:
            return i
    return None


def expert_ops(ops: Sequence[OpCount], split: ExpertSplit, share: float) -> tuple[OpCount, ...]:
    """One device's share of a block's expert-marked ``ops`` (counted on the whole block's tokens),
    the device holding ``share`` = 1 / (t cp) of them (module docstring)."""
    ep, etp, shape = split.degree, split.tensor, split.shape
    rows = ep * etp * split.imbalance * share  # rows per local expert, relative to the count's
    out = []
    for op in ops:
        axis = _token_axis(op.dims, shape) if len(op.dims) == 3 and op.flops > 0 else None
        if axis is None:
            scale = split.imbalance * share
            out.append(replace(op, flops=op.flops * scale, bytes=op.bytes * scale))
            continue
        a, b, c = op.dims
        groups = op.flops / (2.0 * a * b * c)
        elt = op.bytes / (groups * (a * b + b * c + a * c))
        dims = [a, b, c]
        dims[axis] *= rows
        others = [j for j in range(3) if j != axis]
        width = max(others, key=lambda j: (round(dims[j]) != shape.hidden, dims[j]))  # the FFN side
        dims[width] /= etp
        g = groups / ep
        x, y, z = dims
        out.append(replace(op, flops=2.0 * g * x * y * z, bytes=g * (x * y + y * z + x * z) * elt, dims=(x, y, z)))
    return tuple(out)


# --------------------------------------------------------------------------- all-to-all


def alltoall_bytes(split: ExpertSplit, tokens: float, element_bytes: float) -> tuple[float, float]:
    """(NVLink, network) bytes one device sends in one dispatch of ``tokens`` tokens."""
    ep, k, h = split.degree, split.shape.top_k, split.shape.hidden
    if ep <= 1 or tokens <= 0:
        return 0.0, 0.0
    g = max(1, min(split.ranks_per_node, ep))
    pair = h * element_bytes
    intra = tokens * k * pair * (g - 1) / ep
    remote = tokens * k * pair * (ep - g) / ep  # pairs whose expert is on another node
    if not split.deduplicate or ep <= g:
        return intra, remote
    nodes = ep / g
    crossings = (nodes - 1.0) * (1.0 - (1.0 - 1.0 / nodes) ** k)  # distinct remote nodes per token
    if split.max_nodes:
        crossings = min(crossings, float(split.max_nodes))
    network = min(remote, tokens * pair * crossings)
    return intra + (remote - network), network  # the rest forwarded inside the far node


def alltoall_parts(split: ExpertSplit, tokens: float, element_bytes: float) -> tuple[float, float]:
    """(dispatch, combine) seconds of one MoE layer's forward all-to-alls for ``tokens`` tokens
    on a device; each backward one (the combine's gradient dispatched, the dispatch's combined)
    moves the activations' dtype as the combine does, so takes the combine's time."""
    if split.degree <= 1 or tokens <= 0:
        return 0.0, 0.0

    def once(nbytes: float) -> float:
        intra, network = alltoall_bytes(split, tokens, nbytes)
        latency = (split.link_latency_s if intra else 0.0) + (split.network_latency_s if network else 0.0)
        return max(intra / split.nvlink_bandwidth, network / split.network_bandwidth) + latency

    return once(split.dispatch_bytes or element_bytes), once(element_bytes)


def alltoall_s(split: ExpertSplit, tokens: float, element_bytes: float) -> tuple[float, float]:
    """(forward, backward) seconds of one MoE layer's all-to-alls for ``tokens`` tokens on a
    device: dispatch + combine forward, their gradients backward (module docstring)."""
    dispatch, combine = alltoall_parts(split, tokens, element_bytes)
    return dispatch + combine, 2.0 * combine


# --------------------------------------------------------------------------- the model


def _first(config: Any, names: Sequence[str]) -> int | None:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _is_expert(name: str, param: Any, experts: int, listed: set[str]) -> bool:
    if param.dim() >= 3 and param.shape[0] == experts:  # grouped: (E, ., .)
        return True
    m = _LISTED.search(name)
    return m is not None and name[: m.start()] in listed


def _listed_prefixes(names: Sequence[str], experts: int) -> set[str]:
    """Module paths holding exactly ``experts`` numbered experts (``...experts.0`` .. ``.E-1``)."""
    found: dict[str, set[str]] = {}
    for name in names:
        m = _LISTED.search(name)
        if m is not None:
            found.setdefault(name[: m.start()], set()).add(m.group(1))
    return {prefix for prefix, ids in found.items() if len(ids) == experts}


def _matrix(shape: Sequence[int]) -> tuple[int, int]:
    """An expert weight's last two dimensions, sorted: the (rows, cols) its GEMMs multiply by."""
    a, b = int(shape[-2]), int(shape[-1])
    return (a, b) if a <= b else (b, a)


def _container(name: str) -> str:
    """The module holding an expert parameter's layer of experts (``layers.3.ffn.experts``)."""
    m = _LISTED.search(name)
    return name[: m.start()] if m is not None else name.rsplit(".", 1)[0]


def expert_parameters(module: Any, experts: int) -> list[tuple[str, Any]]:
    """``module``'s routed-expert weights, by name: grouped ones, ``(E, ., .)``, and those of a
    list of exactly ``experts`` numbered experts (``...experts.0.w1.weight``)."""
    named = list(module.named_parameters())
    listed = _listed_prefixes([n for n, _ in named], experts)
    return [(n, p) for n, p in named if _is_expert(n, p, experts, listed)]


def expert_storages(module: Any, experts: int) -> frozenset[int]:
    """Storage keys (``timing.storage_key``) of ``module``'s routed-expert weights."""
    from autopipe.costs.measure.timing import storage_key

    return frozenset(storage_key(p) for _, p in expert_parameters(module, experts))


def moe_config(model: Any) -> tuple[int, int] | None:
    """(E, k) from ``model.config`` (Hugging Face's and the bundled files' names), or None."""
    config = getattr(model, "config", None)
    experts, k = _first(config, _EXPERTS), _first(config, _TOP_K)
    if experts is None or k is None or experts < 2:
        return None
    return experts, k


def moe_shape(traced: Any, model: Any, hidden: int, seq: int) -> MoEShape | None:
    """The MoE structure of ``model`` traced as ``traced`` (a ``TracedModel``): E and k from its
    config, the routed-expert parameters each block owns, and the expert matrices' shapes;
    None when it has no routed experts."""
    found = moe_config(model)
    if found is None:
        return None
    experts, k = found
    gm = traced.gm
    names = [n for n, _ in gm.named_parameters()]
    listed = _listed_prefixes(names, experts)
    params: list[int] = []
    layers: list[int] = []
    dims: set[tuple[int, int]] = set()
    for block in traced.blocks:
        owned = [(n, gm.get_parameter(n)) for n in block.params]
        mine = [(n, p) for n, p in owned if _is_expert(n, p, experts, listed)]
        params.append(sum(p.numel() for _, p in mine))
        layers.append(len({_container(n) for n, _ in mine}))
        dims.update(_matrix(p.shape) for _, p in mine if p.dim() >= 2)
    if not any(params):
        return None
    return MoEShape(experts, k, hidden, seq, tuple(params), tuple(layers), tuple(sorted(dims)))


def expert_params_per_device(params: int, split: ExpertSplit | None) -> int:
    """Routed-expert parameter elements one device holds of a block owning ``params`` of them."""
    if split is None:
        return params
    return math.ceil(params / (split.degree * split.tensor))
