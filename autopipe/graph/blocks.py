"""Group a traced graph's nodes into blocks, the units the solver places on stages.

Blocks follow the user's modules: a node belongs to the outermost module on its module path
that is a *layer* (a child of a ``ModuleList`` / ``Sequential`` / ``ModuleDict``, not itself
such a container) or that holds no layers at all (an embedding, a head), or to a module kept
whole with ``--leaf``. Loose ops and tiny parameter-free modules fold into a neighbour; plain
Python values (sizes) that cross a block boundary are folded into constants, so only tensors
flow between blocks. For a GPT that gives the embeddings, one block per transformer layer,
the final norm and the head. The block graph's edges carry the bytes of every
tensor between two blocks: a chain where the model is a chain, a DAG where it has skip connections.

Tests: tests/graph/test_trace.py.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn

__all__ = ["Block", "BlockEdge", "Grouping", "ValueInfo", "block_edges", "group_blocks", "module_path"]

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
_COMPUTE_OPS = ("call_module", "call_function", "call_method")
_MAX_BLOCKS = 2000  # never hand the solver more blocks than this


@dataclass(frozen=True)
class ValueInfo:
    """Shape, dtype and size of a node's value (tensors; 0 bytes for anything else)."""

    shape: tuple[int, ...]
    dtype: str
    bytes: int
    is_tensor: bool


@dataclass(frozen=True)
class Block:
    """A contiguous run of fx nodes that the solver places as one unit."""

    index: int
    name: str  # the user's module path ("blocks.3"), or the loose op's name
    module_type: str  # class name of that module ("" for loose ops)
    nodes: tuple[str, ...]  # fx node names, graph order
    params: tuple[str, ...]  # parameter names this block owns (a shared one: its first user)


@dataclass(frozen=True)
class Grouping:
    """The blocks of a graph and what flows between them."""

    blocks: tuple[Block, ...]
    block_of: dict[str, int]  # fx node name -> block index (compute nodes only)
    values: dict[str, ValueInfo]  # fx node name -> its value's shape/dtype/bytes
    shared_params: tuple[tuple[str, tuple[int, ...]], ...]  # (param, blocks using it)
    edges: tuple[BlockEdge, ...]  # the block graph's edges, in graph order


def group_blocks(
    gm: torch.fx.GraphModule, model: nn.Module, leaf_modules: Sequence[str] = (), max_blocks: int | None = None
) -> Grouping:
    """Blocks of ``gm`` (traced from ``model``); folds cross-block constants into ``gm``."""
    values = _value_infos(gm)
    keys = _node_keys(gm, model, set(leaf_modules))
    groups = _group(gm, keys, values, max_blocks)
    _fold_constants_across_blocks(gm, groups, values)
    blocks, block_of, shared = _make_blocks(gm, model, groups)
    return Grouping(blocks, block_of, values, shared, block_edges(gm, block_of, values))


# --------------------------------------------------------------------------- values


def _value_infos(gm: torch.fx.GraphModule) -> dict[str, ValueInfo]:
    out = {}
    for n in gm.graph.nodes:
        v = n.meta.get("val", n.meta.get("example_value"))
        if isinstance(v, torch.Tensor):
            out[n.name] = ValueInfo(
                tuple(hint_int(s) for s in v.shape), str(v.dtype).removeprefix("torch."), _nbytes(v), True
            )
        else:
            leaves = [t for t in torch.utils._pytree.tree_leaves(v) if isinstance(t, torch.Tensor)]
            out[n.name] = ValueInfo((), "", sum(_nbytes(t) for t in leaves), False)
    return out


def _nbytes(t: torch.Tensor) -> int:
    return hint_int(t.numel()) * t.element_size()


def hint_int(size: int | torch.SymInt) -> int:
    """The size the trace ran at; ``int()`` on a symbolic size would pin it for good (a guard)."""
    hint = getattr(size.node, "hint", None) if isinstance(size, torch.SymInt) else None
    return int(hint) if hint is not None else int(size)


# --------------------------------------------------------------------------- blocks


def module_path(node: torch.fx.Node) -> list[str]:
    """The module paths a node runs in, outermost first (its ``nn_module_stack``; a module call: its own path last)."""
    stack = node.meta.get("nn_module_stack") or {}
    path = []
    for v in stack.values():
        p = v[0] if isinstance(v, tuple) else str(v)
        if p and not p.startswith("_empty_nn_module_stack") and p not in path:
            path.append(p)
    if node.op == "call_module" and str(node.target) not in path:
        path.append(str(node.target))
    return path


def _node_keys(gm: torch.fx.GraphModule, model: nn.Module, leaves: set[str]) -> dict[str, str | None]:
    """For each compute node: the module path of the block it belongs to (None: loose op)."""
    modules = dict(model.named_modules())
    layers = {
        f"{name}.{child}" if name else child
        for name, m in modules.items()
        if isinstance(m, _CONTAINERS) and len(m._modules) >= 2
        for child in m._modules
    }
    holds_layers = {p for layer in layers for p in _prefixes(layer)[:-1]}
    keys: dict[str, str | None] = {}
    for n in gm.graph.nodes:
        if n.op not in _COMPUTE_OPS:
            continue
        key = None
        for p in module_path(n):
            m = modules.get(p)
            if m is None:
                continue
            if type(m).__name__ in leaves:
                key = p
                break
            if p in layers and not (isinstance(m, _CONTAINERS) and p in holds_layers):
                key = p
                break
            if p not in holds_layers:
                key = p
                break
        keys[n.name] = key
    return keys


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _group(
    gm: torch.fx.GraphModule, keys: dict[str, str | None], values: dict[str, ValueInfo], max_blocks: int | None
) -> list[tuple[str, list[torch.fx.Node]]]:
    """Runs of consecutive nodes with one key; loose ops and tiny modules join a neighbour."""
    groups: list[tuple[str | None, list[torch.fx.Node]]] = []
    owner: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op not in _COMPUTE_OPS:
            continue
        key = keys[n.name]
        # Unpacking a tuple stays with the node that made the tuple, so only tensors cross.
        if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node) and n.args[0].name in owner:
            if not values[n.args[0].name].is_tensor:
                groups[owner[n.args[0].name]][1].append(n)
                owner[n.name] = owner[n.args[0].name]
                continue
        if groups and groups[-1][0] == key:
            groups[-1][1].append(n)
        else:
            groups.append((key, [n]))
        owner[n.name] = len(groups) - 1
    # Loose runs join the block before them (or after, at the start).
    merged: list[tuple[str, list[torch.fx.Node]]] = []
    pending: list[torch.fx.Node] = []
    for key, nodes in groups:
        if key is None or (merged and _is_tiny(gm, nodes) and merged[-1][0] != key):
            if merged:
                merged[-1][1].extend(nodes)
            else:
                pending.extend(nodes)
            continue
        if merged and merged[-1][0] == key:
            merged[-1][1].extend(pending + nodes)
        else:
            merged.append((key, pending + nodes))
        pending = []
    if pending:
        if merged:
            merged[-1][1].extend(pending)
        else:
            merged.append(("model", pending))
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    for _, nodes in merged:
        nodes.sort(key=lambda n: order[n.name])
    limit = min(max_blocks or _MAX_BLOCKS, _MAX_BLOCKS)
    return _merge_to(merged, limit)


def _is_tiny(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> bool:
    """A parameter-free run of at most two ops (an activation, a pool, a dropout)."""
    if len(nodes) > 2:
        return False
    for n in nodes:
        if n.op == "call_module" and any(True for _ in gm.get_submodule(str(n.target)).parameters()):
            return False
        if any(
            a.op == "get_attr" and isinstance(_fetch_attr(gm, str(a.target)), torch.Tensor) for a in n.all_input_nodes
        ):
            return False  # holds weights (reading ``self.training`` is no weight)
    return True


def _merge_to(groups: list[tuple[str, list[torch.fx.Node]]], limit: int) -> list[tuple[str, list[torch.fx.Node]]]:
    """Merge neighbours (the smallest pair first) until there are at most ``limit`` groups."""
    groups = [(k, list(v)) for k, v in groups]
    while len(groups) > limit:
        sizes = [len(groups[i][1]) + len(groups[i + 1][1]) for i in range(len(groups) - 1)]
        i = sizes.index(min(sizes))
        a, b = groups[i], groups[i + 1]
        groups[i : i + 2] = [(_join_names(a[0], b[0]), a[1] + b[1])]
    return groups


def _join_names(a: str, b: str) -> str:
    first = a.split("..")[0]
    last = b.split("..")[-1]
    return first if first == last else f"{first}..{last}"


def _fold_constants_across_blocks(
    gm: torch.fx.GraphModule, groups: list[tuple[str, list[torch.fx.Node]]], values: dict[str, ValueInfo]
) -> None:
    """Replace non-tensor values (sizes, dtypes) used in another block by their constant."""
    where = {n.name: i for i, (_, nodes) in enumerate(groups) for n in nodes}
    changed = False
    for i, (_, nodes) in enumerate(groups):
        for n in nodes:
            if values[n.name].is_tensor:
                continue
            v = n.meta.get("val")
            for user in list(n.users):
                if user.name in where and where[user.name] != i and _is_constant(v):
                    user.args = torch.fx.node.map_arg(user.args, lambda a, n=n, v=v: v if a is n else a)  # type: ignore[misc]
                    user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, n=n, v=v: v if a is n else a)  # type: ignore[misc]
                    changed = True
    if changed:
        for _, nodes in groups:
            nodes[:] = [n for n in nodes if n.users or n.op != "call_function" or not _is_pure_size(n)]
        gm.graph.eliminate_dead_code()
        gm.recompile()
        alive = {n.name for n in gm.graph.nodes}
        for _, nodes in groups:
            nodes[:] = [n for n in nodes if n.name in alive]


def _is_pure_size(n: torch.fx.Node) -> bool:
    return n.target in (getattr, operator.getitem) or str(n.target).startswith("aten.sym_size")


def _is_constant(v: Any) -> bool:
    if isinstance(v, (bool, int, float, str, torch.dtype, torch.device, type(None))):
        return True
    if isinstance(v, (tuple, list, torch.Size)):
        return all(_is_constant(x) for x in v)
    return False


def _make_blocks(
    gm: torch.fx.GraphModule, model: nn.Module, groups: list[tuple[str, list[torch.fx.Node]]]
) -> tuple[tuple[Block, ...], dict[str, int], tuple[tuple[str, tuple[int, ...]], ...]]:
    modules = dict(model.named_modules())
    param_ids = {id(p): name for name, p in gm.named_parameters()}
    block_of: dict[str, int] = {}
    users: dict[str, list[int]] = {}
    seen_names: dict[str, int] = {}
    names = []
    for i, (key, nodes) in enumerate(groups):
        count = seen_names.get(key, 0)
        seen_names[key] = count + 1
        names.append(key if count == 0 else f"{key}@{count}")
        for n in nodes:
            block_of[n.name] = i
            for p in _params_of(gm, n):
                name = param_ids.get(id(p))
                if name is not None and i not in users.setdefault(name, []):
                    users[name].append(i)
    owned: dict[int, list[str]] = {}
    for name, bs in users.items():
        owned.setdefault(bs[0], []).append(name)
    blocks = tuple(
        Block(
            index=i,
            name=names[i],
            module_type=type(modules[key]).__name__ if key in modules else "",
            nodes=tuple(n.name for n in nodes),
            params=tuple(sorted(owned.get(i, []))),
        )
        for i, (key, nodes) in enumerate(groups)
    )
    shared = tuple(sorted((name, tuple(bs)) for name, bs in users.items() if len(bs) > 1))
    return blocks, block_of, shared


def _params_of(gm: torch.fx.GraphModule, n: torch.fx.Node) -> list[nn.Parameter]:
    found: list[nn.Parameter] = []
    if n.op == "call_module":
        found.extend(gm.get_submodule(str(n.target)).parameters())
    for a in n.all_input_nodes:
        if a.op == "get_attr":
            v = _fetch_attr(gm, str(a.target))
            if isinstance(v, nn.Parameter):
                found.append(v)
    return found


def _fetch_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class BlockEdge:
    """Block ``src`` -> block ``dst`` of the block graph: the tensors made in one, read in the other."""

    src: int
    dst: int
    bytes: int
    tensors: tuple[str, ...]


def block_edges(
    gm: torch.fx.GraphModule, block_of: dict[str, int], values: dict[str, ValueInfo]
) -> tuple[BlockEdge, ...]:
    """Blocks as a DAG: an edge i -> j carries the tensors made in i and read in j, with bytes."""
    edges: dict[tuple[int, int], list[str]] = {}
    for n in gm.graph.nodes:
        src = block_of.get(n.name)
        if n.op not in _COMPUTE_OPS or src is None:
            continue
        for dst in sorted({block_of[u.name] for u in n.users if u.name in block_of} - {src}):
            edges.setdefault((src, dst), []).append(n.name)
    return tuple(
        BlockEdge(src, dst, sum(values[t].bytes for t in tensors), tuple(tensors))
        for (src, dst), tensors in edges.items()
    )
