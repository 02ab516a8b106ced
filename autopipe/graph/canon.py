"""Name-independent node identities, and a trace relabelled to another rank's naming.

Each rank traces the model on its own, and fx names a node by the order the tracer meets it;
code that loops over a ``set`` of strings (Hugging Face ModernBERT builds its rotary tables
``for layer_type in set(config.layer_types)``) meets the same ops in another order under
another ``PYTHONHASHSEED``, so ``to_10`` is one table on rank 0 and another on rank 1 while
both traces are isomorphic and fingerprint alike. Values that cross ranks are named by their
node, so the names must mean the same on every rank.

:func:`structural_keys` gives every node a key that ignores names: a hash of its op, its
target (a stable string: a function's qualified name, an op's ``aten.mul.Tensor``, a path),
its arguments (a node by its key, a constant by a stable repr, a tensor constant by its
bytes; a parameter or buffer by its path, shape and dtype) and a caller's label (its block).
Equal keys are truly identical computations; they are told apart by their order of
occurrence. :func:`relabel` renames a trace's nodes to a reference's names
(``reference_nodes`` of the reference trace) and rebuilds its graph in the reference's node
order, so both split alike; a trace already named like the reference is returned as it is
(the common case).

Tests: tests/graph/test_canon.py.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from autopipe.errors import RankMismatchError
from autopipe.graph.blocks import block_edges
from autopipe.graph.trace import CREATED, TracedModel

__all__ = ["NodeKey", "reference_nodes", "relabel", "structural_keys", "target_string"]

NodeKey = tuple[str, str, str]  # (node name, structural key, what it computes: op and target)
_MADE = re.compile(r"tensor_constant\d+$")  # fx's and export's names for the tensor constants they keep
_SMALL = 1 << 16  # tensor constants up to this many elements are keyed by their bytes


def target_string(node: torch.fx.Node) -> str:
    """A stable string for what ``node`` calls: never a repr with a memory address."""
    t = node.target
    if node.op != "call_function":
        return str(t)
    if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(t)
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None)
    if isinstance(name, str):
        module = getattr(t, "__module__", None) or type(t).__name__
        # a model file's own function (torch.fx.wrap): its module is named per load
        # (model/load.py's autopipe_user_model_<n>_<stem>), n differing between ranks
        return f"{_USER_MODULE.sub('autopipe_user_model_', module)}.{name}"
    return _stable(t, {})


_USER_MODULE = re.compile(r"^autopipe_user_model_\d+_")


def _stable(v: Any, keys: Mapping[torch.fx.Node, str]) -> str:
    """A stable repr of an argument: nodes by their keys, containers recursively."""
    if isinstance(v, torch.fx.Node):
        return f"@{keys[v]}"
    if isinstance(v, (tuple, list)):
        inner = ",".join(_stable(x, keys) for x in v)
        return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
    if isinstance(v, dict):
        items = sorted((str(k), _stable(x, keys)) for k, x in v.items())
        return "{" + ",".join(f"{k}:{x}" for k, x in items) + "}"
    if isinstance(v, slice):
        return f"slice({_stable(v.start, keys)},{_stable(v.stop, keys)},{_stable(v.step, keys)})"
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return repr(v)
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v)
    if isinstance(v, torch.Tensor):
        return _tensor_key(v)
    if isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}.{v.name}"
    if callable(v) and isinstance(getattr(v, "__qualname__", None), str):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    text = repr(v)
    return f"<{type(v).__module__}.{type(v).__qualname__}>" if " at 0x" in text else text


def _tensor_key(t: torch.Tensor, whole: bool = False) -> str:
    """A tensor: shape and dtype, and its bytes when small or ``whole`` (a parameter: never)."""
    head = f"tensor{tuple(t.shape)}:{t.dtype}"
    if (
        isinstance(t, torch.nn.Parameter)
        or t.is_meta
        or t.layout != torch.strided
        or (t.numel() > _SMALL and not whole)
    ):
        return head
    try:
        data = t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
    except Exception:  # a tensor subclass or fake tensor: its shape is all we can say
        return head
    return f"{head}:{hashlib.sha256(data).hexdigest()[:12]}"


def _base_keys(gm: torch.fx.GraphModule, labels: Mapping[str, str]) -> dict[torch.fx.Node, str]:
    state = {n for n, _ in gm.named_parameters(remove_duplicate=False)}
    state |= {n for n, _ in gm.named_buffers(remove_duplicate=False)}
    keys: dict[torch.fx.Node, str] = {}
    for n in gm.graph.nodes:
        target = target_string(n)
        value = _attr(gm, target) if n.op == "get_attr" else None
        tail = ""
        if isinstance(value, torch.Tensor):
            # A constant the tracer made (``_tensor_constant0``, a buffer of the graph module) is
            # numbered as it was met: keyed by its bytes, not its name; the model's own parameters
            # and buffers by their path, shape and dtype.
            if target not in state or _MADE.search(target) is not None:
                target, tail = "constant", _tensor_key(value, whole=True)
            else:  # not its values: ranks may load their own stages' weights before the first step
                tail = f"tensor{tuple(value.shape)}:{value.dtype}"
        parts = [n.op, target, labels.get(n.name, ""), _stable(n.args, keys), _stable(n.kwargs, keys), tail]
        keys[n] = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:20]
    return keys


def _attr(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def structural_keys(gm: torch.fx.GraphModule, labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """Node name -> a key that does not depend on any node's name (see the module docstring).

    ``labels``: an extra word per node name mixed into its key (its block, say). The k-th
    node (k > 0, graph order) of a key shared by several gets ``#k`` appended.
    """
    seen: dict[str, int] = {}
    out: dict[str, str] = {}
    for n, key in _base_keys(gm, labels or {}).items():
        k = seen.get(key, 0)
        seen[key] = k + 1
        out[n.name] = key if k == 0 else f"{key}#{k}"
    return out


def _labels(traced: TracedModel) -> dict[str, str]:
    return {name: str(b) for name, b in traced.block_of.items()}


def reference_nodes(traced: TracedModel) -> list[NodeKey]:
    """Every node of ``traced`` as (name, key, what), in graph order: what another rank
    :func:`relabel` s its own trace to."""
    keys = structural_keys(traced.gm, _labels(traced))
    return [(n.name, keys[n.name], f"{n.op} {target_string(n)}") for n in traced.gm.graph.nodes]


def relabel(traced: TracedModel, reference: Sequence[NodeKey], *, rank: int, ref_rank: int = 0) -> TracedModel:
    """``traced`` named and ordered as the trace ``reference`` describes (:func:`reference_nodes`).

    The same object when it is named so already. RankMismatchError when the two traces differ
    (``rank`` and ``ref_rank`` name the two ranks in the message).
    """
    mine = reference_nodes(traced)
    if [(a, b) for a, b, _ in mine] == [(a, b) for a, b, _ in reference]:
        return traced
    by_key = {key: name for name, key, _ in mine}
    ref_keys = {key for _, key, _ in reference}
    fix = "build the model the same way on every rank (same file, arguments, code and library versions)"
    for name, key, what in reference:
        if key not in by_key:
            raise RankMismatchError(
                f"rank {rank} traced another model than rank {ref_rank} (rank {ref_rank}'s node {name} = {what}(..) "
                f"has no match on rank {rank}); {fix}"
            )
    for name, key, what in mine:
        if key not in ref_keys:
            raise RankMismatchError(
                f"rank {rank} traced another model than rank {ref_rank} (rank {rank}'s node {name} = {what}(..) "
                f"has no match on rank {ref_rank}); {fix}"
            )
    rename = {by_key[key]: name for name, key, _ in reference}
    return _renamed(traced, rename, [by_key[key] for _, key, _ in reference])


def _renamed(traced: TracedModel, rename: dict[str, str], order: list[str]) -> TracedModel:
    """``traced`` with its nodes renamed by ``rename`` and its graph rebuilt in ``order``
    (this trace's names, the new order): every field that names a node follows."""
    old = traced.gm.graph
    by_name = {n.name: n for n in old.nodes}
    base = _base_keys(traced.gm, _labels(traced))
    g = torch.fx.Graph(tracer_cls=old._tracer_cls, tracer_extras=old._tracer_extras)
    g._codegen = old._codegen
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    made: dict[str, torch.fx.Node] = {}  # base key -> the first node made with it

    def arg(a: torch.fx.Node) -> torch.fx.Node:
        # An argument not made yet has a twin (the same computation) that was: take it.
        found = env.get(a) or made.get(base[a])
        if found is None:
            raise RankMismatchError(
                f"cannot order node {a.name} as the other ranks do (a node that reads it comes first there); "
                "build the model the same way on every rank"
            )
        return found

    for name in order:
        n = by_name[name]
        new = g.create_node(
            n.op,
            n.target,
            torch.fx.node.map_arg(n.args, arg),
            torch.fx.node.map_arg(n.kwargs, arg),
            rename[name],
            n.type,
        )
        if new.name != rename[name]:
            raise RankMismatchError(
                f"cannot name node {name} {rename[name]} as the other ranks do (fx made it {new.name}); "
                "build the model the same way on every rank"
            )
        new.meta = dict(n.meta)
        env[n] = new
        made.setdefault(base[n], new)
    g.lint()
    gm = torch.fx.GraphModule(traced.gm, g, class_name=type(traced.gm).__name__)
    gm.meta.update(traced.gm.meta)
    if CREATED in gm.meta:
        gm.meta[CREATED] = tuple((c, p, rename.get(given, given)) for c, p, given in gm.meta[CREATED])
    gm.train(traced.gm.training)
    return _follow(traced, gm, rename)


def _follow(traced: TracedModel, gm: torch.fx.GraphModule, rename: dict[str, str]) -> TracedModel:
    position = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    block_of = {rename[n]: b for n, b in traced.block_of.items()}
    blocks = tuple(
        dataclasses.replace(b, nodes=tuple(sorted((rename[n] for n in b.nodes), key=position.__getitem__)))
        for b in traced.blocks
    )
    values = {n: v for n, v in traced.values.items() if n not in rename and n not in position}
    values.update({rename[n]: v for n, v in traced.values.items() if n in rename})
    return dataclasses.replace(
        traced,
        gm=gm,
        blocks=blocks,
        block_of=dict(sorted(block_of.items(), key=lambda kv: position[kv[0]])),
        values=values,
        input_names=tuple(n.name for n in gm.graph.nodes if n.op == "placeholder"),
        edges=block_edges(gm, block_of, values),
    )
