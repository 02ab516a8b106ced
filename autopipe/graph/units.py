"""Which part of a transformer layer each fx node is: the module kinds that selective
recomputation and activation offload name.

Megatron-LM recomputes and offloads by module kind (``--recompute-modules core_attn mlp
layernorm``, ``--offload-modules attn_norm qkv_linear core_attn attn_proj mlp_norm``;
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models").
autopipe prices the same choices from a block's own ops, so it needs to know, per fx node of a
layer block, which of these parts it belongs to (:data:`UNITS`):

- ``core_attn``: the attention core. A fused ``scaled_dot_product_attention`` node, or in eager
  attention every node on a path from the scores' matmul through the softmax to the matmul
  with the values (scaling, masking and dropout included);
- ``qkv_linear`` / ``attn_proj``: the linear layers of the attention module (the deepest module
  around the core that holds a linear layer) before the core / after it;
- ``mla_up``: in multi-head latent attention (a linear layer of the attention module runs after
  one of its norms and feeds the core: DeepSeek-V2's up-projections from the normed latents),
  every node of the attention module that feeds the core from the latent norms on: the
  up-projections, the split into heads, the rotary embedding and the concatenation (what
  Megatron-Core's ``mla_up_proj`` recomputes, ``qkv_up_proj_and_rope_apply``), in place of
  ``qkv_linear`` there;
- ``attn_norm`` / ``mlp_norm``: a norm module of the layer (outside the attention module)
  before the core / after it and before the MLP's first linear layer;
- ``mlp_fc1``, ``mlp_act``, ``mlp_fc2``, ``mlp_other``: the MLP, the linear layers after the core
  outside the attention module: the first ones, the nodes between them and the last one (the
  activation: GELU, or SiLU times the up projection), and the rest of the MLP module (dropout).

What is found comes from the graph alone: the nodes' module paths (``nn_module_stack``, which
both tracers record), the module classes (``Linear``, Hugging Face's ``Conv1D``, a class whose
name ends in ``Norm``) and the ops (``linear``/``addmm``/``mm``, ``layer_norm``, softmax,
matmul, attention). A block without an attention core (an embedding, a head, a convolution),
or one holding more than one attention core (two layers, a cross-attention) gets no units, and
nothing is offered for it: no guess; an MLP that routes tokens to experts (``topk``) gets none
of the MLP's.

Tests: tests/graph/test_layer_parts.py.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.fx
from torch import nn

from autopipe.graph.blocks import module_path
from autopipe.graph.kinds import UNITS

__all__ = ["UNITS", "block_units", "node_units", "op_name"]


_SDPA = {
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "flex_attention",
}
_SOFTMAX = {"softmax", "_softmax", "_safe_softmax"}
_MATMUL = {"matmul", "bmm", "baddbmm", "einsum", "__matmul__"}
_LINEAR_OPS = {"linear", "addmm", "mm"}
_NORM_OPS = {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"}
_ROUTING = {"topk", "sort", "argsort"}
_LINEAR_CLASSES = ("Linear", "Conv1D")


def op_name(node: torch.fx.Node) -> str:
    """The op a node runs, by one name whatever the tracer wrote: ``softmax`` for ``F.softmax``,
    ``x.softmax`` and ``aten.softmax.int``; the module's class name for a module call."""
    target = node.target
    if node.op == "call_method":
        return str(target)
    if node.op == "call_module":
        return ""
    if target is operator.matmul:
        return "matmul"
    opname = getattr(target, "_opname", None)  # aten OpOverload
    if isinstance(opname, str):
        return opname
    return str(getattr(target, "__name__", ""))


def node_units(gm: torch.fx.GraphModule, model: nn.Module, blocks: Iterable[Sequence[str]]) -> dict[str, str]:
    """The unit (one of :data:`UNITS`) of every node of the layer blocks among ``blocks`` (each
    the names of its nodes); nodes of no unit, and blocks that are no layer, are left out."""
    by_name = {n.name: n for n in gm.graph.nodes}
    modules = dict(model.named_modules())
    out: dict[str, str] = {}
    for names in blocks:
        out.update(block_units([by_name[n] for n in names if n in by_name], modules))
    return out


def block_units(nodes: Sequence[torch.fx.Node], modules: Mapping[str, nn.Module]) -> dict[str, str]:
    """The units of one block's nodes (graph order); {} when the block is not one layer."""
    inside = set(nodes)
    paths = {n: module_path(n) for n in nodes}
    instances = _core_attention(nodes, inside)
    if len(instances) != 1:
        return {}  # no attention, or more than one layer's (or a cross-attention): not one layer
    core = set(instances[0])
    before, after = _ancestors(core, inside), _descendants(core, inside)

    def side(group: list[torch.fx.Node]) -> str:
        """Where a group runs against the core: "before" (it feeds it), "after" (it reads it) or ""."""
        up, down = any(n in before for n in group), any(n in after for n in group)
        return "before" if up and not down else "after" if down and not up else ""

    linear = _groups(nodes, paths, modules, _is_linear)
    attn = _attention_module(instances[0], [(g, side(g)) for g in linear], paths)
    units: dict[torch.fx.Node, str] = dict.fromkeys(core, "core_attn")
    rest: list[list[torch.fx.Node]] = []
    for group in linear:
        if attn and all(attn in paths[n] for n in group):
            name = {"before": "qkv_linear", "after": "attn_proj"}.get(side(group))
            units.update(dict.fromkeys(group, name) if name else {})
        elif side(group) != "before":
            rest.append(group)
    if attn:
        units.update(dict.fromkeys(_latent_up(nodes, inside, paths, modules, attn, before), "mla_up"))
    layer = _common_module([paths[n] for n in nodes])
    fc1 = _mlp(rest, nodes, inside, paths, units, layer)  # none for experts routed by top-k: the rest stands
    for group in _groups(nodes, paths, modules, _is_norm):
        if attn and all(attn in paths[n] for n in group):
            continue  # a query/key norm belongs to the attention module
        if side(group) == "before":
            units.update(dict.fromkeys(group, "attn_norm"))
        elif fc1 & _descendants(set(group), inside):
            units.update(dict.fromkeys(group, "mlp_norm"))
    return {n.name: u for n, u in units.items()}


def _latent_up(
    nodes: Sequence[torch.fx.Node],
    inside: set[torch.fx.Node],
    paths: Mapping[torch.fx.Node, list[str]],
    modules: Mapping[str, nn.Module],
    attn: str,
    before: set[torch.fx.Node],
) -> set[torch.fx.Node]:
    """Multi-head latent attention's up-projection (the ``mla_up`` unit, module docstring): the
    attention module's nodes that feed the core, less its norms and what feeds them; empty where
    no linear layer of the module runs after one of its norms (not latent attention)."""
    mine = [n for n in nodes if attn in paths[n]]
    norms = {n for g in _groups(mine, paths, modules, _is_norm) for n in g}
    if not norms:
        return set()
    after_norm = _descendants(norms, inside)
    if not any(set(g) & before & after_norm for g in _groups(mine, paths, modules, _is_linear)):
        return set()
    upstream = _ancestors(norms, inside) | norms
    return {n for n in mine if n in before and n not in upstream}


def _mlp(
    linears: list[list[torch.fx.Node]],
    nodes: Sequence[torch.fx.Node],
    inside: set[torch.fx.Node],
    paths: Mapping[torch.fx.Node, list[str]],
    units: dict[torch.fx.Node, str],
    layer: str,
) -> set[torch.fx.Node]:
    """Label the MLP (the linear layers outside the attention module): its first linear layers,
    the activation between them and the last, and the rest of its own module (where it has
    one below the layer); returns the first linear layers' nodes (empty where there is no
    MLP, or its experts are routed by top-k)."""
    if len(linears) < 2:
        return set()
    fc2 = linears[-1]
    fc1 = [g for g in linears[:-1] if set(fc2) & _descendants(set(g), inside)]
    first = {n for g in fc1 for n in g}
    act = (_descendants(first, inside) & _ancestors(set(fc2), inside)) - first - set(fc2)
    if not any(op_name(n) not in _SHAPE_OPS for n in act):
        return set()  # nothing but reshapes between them: no activation, not an MLP
    module = _common_module([paths[n] for n in first | set(fc2)])
    inner = [n for n in nodes if module != layer and module in paths[n]] if module else []
    if any(op_name(n) in _ROUTING for n in inner):
        return set()
    units.update(dict.fromkeys((n for n in inner if n not in units), "mlp_other"))
    units.update(dict.fromkeys(first, "mlp_fc1"))
    units.update(dict.fromkeys(act, "mlp_act"))
    units.update(dict.fromkeys(fc2, "mlp_fc2"))
    return first


_SHAPE_OPS = {
    "view",
    "reshape",
    "_unsafe_view",
    "transpose",
    "permute",
    "contiguous",
    "flatten",
    "unflatten",
    "getitem",
    "t",
    "expand",
    "clone",
}


def _core_attention(nodes: Sequence[torch.fx.Node], inside: set[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """Each attention core's nodes (graph order): a fused attention op alone, or a softmax's
    path from the scores' matmul to the values' matmul."""
    order = {n: i for i, n in enumerate(nodes)}
    found: list[set[torch.fx.Node]] = [{n} for n in nodes if op_name(n) in _SDPA]
    for s in (n for n in nodes if op_name(n) in _SOFTMAX):
        up = [a for a in _ancestors({s}, inside) if op_name(a) in _MATMUL]
        down = [d for d in _descendants({s}, inside) if op_name(d) in _MATMUL]
        if up and down:
            scores, values = max(up, key=order.__getitem__), min(down, key=order.__getitem__)
            found.append((_descendants({scores}, inside) | {scores}) & (_ancestors({values}, inside) | {values}))
    return [sorted(core, key=order.__getitem__) for core in found]


def _is_linear(n: torch.fx.Node, path: list[str], modules: Mapping[str, nn.Module]) -> str | None:
    for p in reversed(path):
        m = modules.get(p)
        if m is not None and type(m).__name__.endswith(_LINEAR_CLASSES):
            return p
    return f"#{n.name}" if op_name(n) in _LINEAR_OPS else None


def _is_norm(n: torch.fx.Node, path: list[str], modules: Mapping[str, nn.Module]) -> str | None:
    for p in reversed(path):
        m = modules.get(p)
        name = type(m).__name__ if m is not None else ""
        if name.endswith("Norm") and not name.startswith(("BatchNorm", "GroupNorm", "InstanceNorm")):
            return p
    return f"#{n.name}" if op_name(n) in _NORM_OPS else None


def _groups(
    nodes: Sequence[torch.fx.Node],
    paths: Mapping[torch.fx.Node, list[str]],
    modules: Mapping[str, nn.Module],
    key: object,
) -> list[list[torch.fx.Node]]:
    """Runs of consecutive nodes that ``key(node, path, modules)`` gives one name (a module
    call's nodes; a functional op alone), in graph order; nodes it gives None are left out."""
    out: list[list[torch.fx.Node]] = []
    last: str | None = None
    previous: torch.fx.Node | None = None
    for n in nodes:
        k = key(n, paths[n], modules)  # type: ignore[operator]
        if k is None:
            last = None
            continue
        if k == last and previous is not None and previous.next is n:
            out[-1].append(n)
        else:
            out.append([n])
        last, previous = k, n
    return out


def _attention_module(
    core: Sequence[torch.fx.Node],
    linears: Sequence[tuple[list[torch.fx.Node], str]],
    paths: Mapping[torch.fx.Node, list[str]],
) -> str:
    """The attention module: the deepest module around the core whose linear layers include one
    that feeds the core and one that reads it (q, k, v and the output projection), else the
    deepest holding one that feeds it ("" for none)."""
    around = _common_module([paths[n] for n in core])
    candidates = []
    while around:
        sides = {side for group, side in linears if all(around in paths[n] for n in group)}
        if {"before", "after"} <= sides:
            return around
        if "before" in sides:
            candidates.append(around)
        around = around.rpartition(".")[0]
    return candidates[0] if candidates else ""


def _common_module(paths: Sequence[list[str]]) -> str:
    """The deepest module path every one of ``paths`` runs in ("" for none)."""
    if not paths:
        return ""
    common = set(paths[0])
    for p in paths[1:]:
        common &= set(p)
    return max(common, key=lambda p: p.count(".") + 1 if p else 0, default="")


def _ancestors(start: set[torch.fx.Node], inside: set[torch.fx.Node]) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    todo = [a for n in start for a in n.all_input_nodes]
    while todo:
        n = todo.pop()
        if n in seen or n not in inside:
            continue
        seen.add(n)
        todo.extend(n.all_input_nodes)
    return seen


def _descendants(start: set[torch.fx.Node], inside: set[torch.fx.Node]) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    todo = [u for n in start for u in n.users]
    while todo:
        n = todo.pop()
        if n in seen or n not in inside:
            continue
        seen.add(n)
        todo.extend(n.users)
    return seen
