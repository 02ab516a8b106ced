"""Trace a deep model of identical layers as a shallow copy of it, and name the deep graph.

A transformer's cost is its layer's cost again and again: GPT-3 175B traces 96 copies of one
layer (2,000+ nodes, shape propagation of each) to count one. When the model's longest
``nn.ModuleList`` holds :data:`MIN_LAYERS` or more layers that are provably alike
(:func:`repeated_layers`: same class, same parameter and buffer shapes, dtypes and flags, same
plain attributes, no hooks, module by module) -- all of them, or all from some ``start`` on
(DeepSeek-V3's 58 MoE layers after its 3 dense ones) --, :func:`shallow_copy` is the same
model with the list cut to the layers before ``start`` and the run's first :data:`SHALLOW`
(weights shared, nothing copied): the run's first layer, one middle layer and its last. The
shallow trace stands for the deep one when its structure says so (:func:`deep_names`: the
nodes the fx tracer created are the model's own nodes before the layers, then each layer's in
turn, then the ones after), and the deep graph's node names are what the fx tracer would give
them: its namer replayed (torch's own ``_Namespace``) over the deep sequence of node names it
was asked for -- before the layers, the leading layers, the run's first, the middle layer's
``L - start - 2`` times with its module paths renumbered, the last layer, after -- a replay
checked to give the shallow trace's names back first, and its result checked against the
names fx gives the deep model's nodes (a symbolic trace at full depth, with no shapes run: a
tenth of a second for GPT-3 175B), so a forward that does not call every layer in turn is
caught. Anything else (torch.export traces, a block limit, nodes made after tracing) is
counted in full by the caller.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn
from torch.fx.graph import _Namespace

from autopipe.graph.trace import structure_hash

__all__ = [
    "MIN_LAYERS",
    "SHALLOW",
    "Layers",
    "deep_fingerprint",
    "deep_names",
    "repeated_layers",
    "shallow_copy",
]

SHALLOW = 3  # layers traced: the first, one middle one, the last
MIN_LAYERS = SHALLOW + 2  # fewer are traced whole: the shallow copy would save little
_PRIVATE = ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")


@dataclass(frozen=True)
class Layers:
    """The model's layers ``prefix.0`` .. ``prefix.{count-1}``, alike from ``prefix.{start}`` on
    (the first ``start`` ones, DeepSeek's dense layers before its MoE ones, are traced as they are)."""

    prefix: str  # module path of the nn.ModuleList, e.g. "blocks", "model.layers"
    count: int  # layers in the model
    start: int = 0  # the repeated run's first layer

    @property
    def run(self) -> int:
        """Layers in the repeated run."""
        return self.count - self.start

    @property
    def kept(self) -> int:
        """Layers the shallow copy holds: the leading ones, then the run's first, a middle one, its last."""
        return self.start + SHALLOW

    def source(self, j: int) -> int:
        """The shallow layer that stands for deep layer ``j``."""
        if j <= self.start:
            return j
        return self.kept - 1 if j == self.count - 1 else self.start + 1

    def copies(self, s: int) -> range:
        """The deep layers shallow layer ``s`` stands for."""
        if s <= self.start:
            return range(s, s + 1)
        return range(self.count - 1, self.count) if s == self.kept - 1 else range(self.start + 1, self.count - 1)

    def layer_of(self, path: str) -> int | None:
        """The layer index of a module path inside the list (``blocks.3.attn`` -> 3), else None."""
        head = self.prefix + "."
        if not path.startswith(head):
            return None
        index = path[len(head) :].split(".", 1)[0]
        return int(index) if index.isdigit() else None

    def renumber(self, text: str, s: int, j: int) -> str:
        """``text`` (a module path, or its snake-cased fx name) of layer ``s`` moved to layer ``j``."""
        for old, new in (
            (f"{self.prefix}.{s}", f"{self.prefix}.{j}"),
            (_snake(f"{self.prefix}.{s}"), _snake(f"{self.prefix}.{j}")),
        ):
            if text == old or text.startswith(old + "."):
                return new + text[len(old) :]
        return text


def repeated_layers(model: nn.Module) -> Layers | None:
    """The longest ``nn.ModuleList`` of ``model`` when its layers from some ``start`` on, at
    least :data:`MIN_LAYERS` of them, are alike in every way a trace can see (see the module
    docstring; ``start`` is 0 when all are), else None."""
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and name]
    if not lists:
        return None
    prefix, longest = max(lists, key=lambda x: len(x[1]))
    if len(longest) < MIN_LAYERS or list(longest._modules) != [str(i) for i in range(len(longest))]:
        return None
    last = _state(longest[-1])
    if last is None:
        return None
    start = len(longest) - 1
    while start > 0 and _state(longest[start - 1]) == last:
        start -= 1
    if len(longest) - start < MIN_LAYERS:
        return None
    return Layers(prefix, len(longest), start)


def _state(layer: nn.Module) -> tuple[object, ...] | None:
    """What a trace and a count of ``layer`` can depend on, module by module; None when it
    holds something not comparable by value (a hook, a function, an object)."""
    out: list[object] = []
    for name, m in layer.named_modules(remove_duplicate=False):
        attrs = []
        for key, value in sorted(vars(m).items()):
            if key in _PRIVATE:
                continue
            if "hook" in key:
                if value:  # a hook can do anything
                    return None
                continue
            if not isinstance(value, (bool, int, float, str, type(None), tuple)) or not _plain(value):
                return None
            attrs.append((key, value))
        tensors = [
            (k, tuple(t.shape), t.dtype, t.requires_grad)
            for k, t in (*m._parameters.items(), *m._buffers.items())
            if t is not None
        ]
        out.append((name, type(m), tuple(attrs), tuple(tensors)))
    return tuple(out)


def _plain(value: object) -> bool:
    if isinstance(value, tuple):
        return all(isinstance(v, (bool, int, float, str, type(None))) for v in value)
    return True


def shallow_copy(model: nn.Module, layers: Layers) -> nn.Module:
    """``model`` with its layer list cut to its leading layers and the run's first :data:`SHALLOW`
    (``Layers.kept``); the modules on the way to the list are copied (their child tables only),
    everything else is shared."""
    parts = layers.prefix.split(".")
    root = copy.copy(model)
    node = root
    for part in parts[:-1]:
        child = copy.copy(node.get_submodule(part))
        node._modules = {**node._modules, part: child}
        node = child
    full = node.get_submodule(parts[-1])
    node._modules = {**node._modules, parts[-1]: nn.ModuleList(list(full.children())[: layers.kept])}
    return root


def deep_names(
    created: Sequence[tuple[str, str, str]], survivors: Sequence[str], layers: Layers, full: Sequence[str] | None
) -> dict[str, tuple[str, ...]] | None:
    """Shallow node name -> its names in the deep graph (one per copy, :meth:`Layers.copies`;
    one for a node before or after the layers), from the fx tracer's ``created`` nodes in
    order ``(candidate name, module path, name given)``; None when the shallow trace does not
    stand for the deep one (see the module docstring). ``survivors``: the nodes of the graph;
    ``full``: the names fx gives the deep model's nodes as it makes them
    (``trace.fx_node_names``, no shapes run), which the prediction must equal, in order."""
    runs: list[int | None] = [layers.layer_of(path) for _, path, _ in created]
    order = [r for i, r in enumerate(runs) if r is not None and (i == 0 or runs[i - 1] != r)]
    inside = [i for i, r in enumerate(runs) if r is not None]
    if order != list(range(layers.kept)) or not inside:
        return None
    if any(runs[i] is None for i in range(inside[0], inside[-1] + 1)):
        return None
    if not set(survivors) <= {name for _, _, name in created} or not _replays(created):
        return None
    before = created[: inside[0]]
    after = created[inside[-1] + 1 :]
    by_layer = [[c for c, r in zip(created, runs, strict=True) if r == s] for s in range(layers.kept)]
    deep: list[tuple[str, str]] = [(c, n) for c, _, n in before]
    for j in range(layers.count):
        s = layers.source(j)
        deep += [(layers.renumber(c, s, j), n) for c, _, n in by_layer[s]]
    deep += [(c, n) for c, _, n in after]
    space = _Namespace()
    out: dict[str, list[str]] = {}
    made = []
    for candidate, shallow_name in deep:
        made.append(space.create_name(candidate, None))
        out.setdefault(shallow_name, []).append(made[-1])
    if full is None or tuple(made) != tuple(full):  # the deep model is not the copy's layers repeated
        return None
    return {name: tuple(names) for name, names in out.items()}


def _replays(created: Sequence[tuple[str, str, str]]) -> bool:
    """Whether torch's namer, replayed over the candidates, gives the tracer's names back."""
    space = _Namespace()
    return all(space.create_name(candidate, None) == name for candidate, _, name in created)


def deep_fingerprint(
    tracer: str,
    params: Sequence[tuple[str, tuple[int, ...], str]],
    blocks: Sequence[tuple[str, Sequence[str]]],
    layers: Layers,
) -> str:
    """``TracedModel.fingerprint`` of the deep trace: ``params`` are the shallow graph's
    ``(name, shape, dtype)`` (its layers' repeated over every deep layer), ``blocks`` the deep ones."""
    deep: list[tuple[str, tuple[int, ...], str]] = []
    for name, shape, dtype in params:
        s = layers.layer_of(name)
        if s is None or s < layers.start:
            deep.append((name, shape, dtype))
        elif s == layers.start:
            deep += [(layers.renumber(name, s, j), shape, dtype) for j in range(s, layers.count)]
    return structure_hash(tracer, deep, blocks)


def _snake(text: str) -> str:
    """fx's ``_snake_case`` of a module path (the candidate name of its call_module node)."""
    return re.sub(r"(?<=[a-z])([A-Z])", r"_\1", text).lower()
