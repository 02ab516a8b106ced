"""A deep model's profile from the count of a shallow copy of it (``count_model(shallow=True)``).

The shallow copy (``graph.shallow``) holds the model's leading layers (those not alike the
rest: none, or DeepSeek's dense ones) and the repeated run's first layer, one middle layer and
its last; its profile becomes the deep model's by repeating the middle layer's block
``run - 2`` times, under the names the deep trace gives its nodes, with every tensor between two layers
repeated between every two. It stands for the full count only when its structure proves it
(:func:`repeat_of`), else the caller counts the model in full:

- the run's three layers are three consecutive blocks named ``prefix.<start>`` and the next two,
  and no block after them is a layer (the leading layers are blocks before them, counted whole);
- the middle and the last layer's counts are one count (the counter found their computation,
  constants and input shapes identical), so every layer after the first computes the same
  thing on the same shapes, by induction;
- tensors flow as in a chain: from before the layers to the first layer (or to every layer:
  a rotary table), from each layer to the next only, from the last layer to after the layers;
  no layer shares a parameter with another block;
- fx's symbolic trace of the whole model (no shapes run) makes the nodes, in order and by
  name, that the copy's layers repeated predict (``graph.shallow.deep_names``).

Then the profile equals the one counted in full, block for block and tensor for tensor, and
so does the fingerprint of the trace it names (the test counts small models both ways).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from autopipe.costs.counting import BlockCount
from autopipe.costs.measure.measured import crossing_tensors
from autopipe.costs.profile import Profile, TensorCost
from autopipe.graph.shallow import SHALLOW, Layers, deep_fingerprint, deep_names
from autopipe.graph.trace import CREATED, TracedModel

__all__ = ["Repeat", "deepen_profile", "repeat_of"]


@dataclass(frozen=True)
class Repeat:
    """How a shallow count stands for the deep model."""

    layers: Layers
    first: int  # block index of the repeated run's first layer, in both
    names: Mapping[str, tuple[str, ...]]  # shallow node name -> deep names (graph.shallow.deep_names)
    fingerprint: str  # the deep trace's

    @property
    def grow(self) -> int:
        return self.layers.run - SHALLOW

    def index(self, i: int) -> int:
        """Deep block index of shallow block ``i`` (a layer's: its first copy)."""
        if i < self.first:
            return i
        if i >= self.first + SHALLOW:
            return i + self.grow
        return self.first + self.layers.copies(self.layers.start + i - self.first)[0] - self.layers.start

    def name(self, node: str, j: int | None = None) -> str:
        """Deep name of shallow node ``node`` (``j``: in deep layer ``j``, for a layer's node)."""
        names = self.names[node]
        return names[0] if j is None else names[j - self.layers.copies(self.layers.source(j)).start]


def repeat_of(
    traced: TracedModel, counts: Sequence[Sequence[BlockCount]], layers: Layers, full: Sequence[str] | None
) -> Repeat | None:
    """The :class:`Repeat` that deepens the count of a shallow trace, or None when its
    structure does not prove the deep count (see the module docstring); ``full``: the names
    fx gives the deep model's nodes (``graph.trace.fx_node_names``)."""
    names = [b.name for b in traced.blocks]
    wanted = [f"{layers.prefix}.{s}" for s in range(layers.start, layers.kept)]
    if traced.tracer != "fx" or CREATED not in traced.gm.meta or wanted[0] not in names:
        return None
    first = names.index(wanted[0])
    if names[first : first + SHALLOW] != wanted or any(
        (layers.layer_of(n) or 0) >= layers.start and layers.layer_of(n) is not None
        for n in names[:first] + names[first + SHALLOW :]
    ):
        return None
    if any(c[first + 1] is not c[first + 2] for c in counts):
        return None
    deep = deep_names(traced.gm.meta[CREATED], [n.name for n in traced.gm.graph.nodes], layers, full)
    if deep is None or not all(n in deep for b in traced.blocks for n in b.nodes):
        return None
    rep = Repeat(layers, first, deep, "")
    if any(first <= i < first + SHALLOW for _, users in traced.shared_params for i in users):
        return None
    if _deep_tensors(crossing_tensors([traced]), rep) is None:
        return None
    params = [(n, tuple(p.shape), str(p.dtype)) for n, p in traced.gm.named_parameters(remove_duplicate=False)]
    blocks = [(name, nodes) for name, nodes, _ in _deep_blocks([(b.name, b.nodes) for b in traced.blocks], rep)]
    return replace(rep, fingerprint=deep_fingerprint(traced.tracer, params, blocks, layers))


def deepen_profile(profile: Profile, rep: Repeat) -> Profile:
    """The deep model's profile from the shallow copy's (:func:`repeat_of` said it may)."""
    made = _deep_blocks([(b.name, b.nodes) for b in profile.blocks], rep)
    blocks = tuple(replace(profile.blocks[i], name=name, nodes=nodes) for name, nodes, i in made)
    tensors = _deep_tensors(profile.tensors, rep)
    if tensors is None:  # repeat_of checked the same tensors
        raise AssertionError("the shallow profile's tensors do not repeat")
    shared = tuple((name, tuple(rep.index(i) for i in users)) for name, users in profile.shared_params)
    recipe = replace(profile.recipe, fingerprint=rep.fingerprint)
    return replace(profile, blocks=blocks, tensors=tuple(tensors), shared_params=shared, recipe=recipe)


def _deep_blocks(blocks: Sequence[tuple[str, tuple[str, ...]]], rep: Repeat) -> list[tuple[str, tuple[str, ...], int]]:
    """(name, nodes, shallow index) of every deep block, in order."""
    out = []
    for i, (name, nodes) in enumerate(blocks):
        s = i - rep.first
        if 0 <= s < SHALLOW:
            for j in rep.layers.copies(rep.layers.start + s):
                out.append((f"{rep.layers.prefix}.{j}", tuple(rep.name(n, j) for n in nodes), i))
        else:
            out.append((rep.name(name) if name in nodes else name, tuple(rep.name(n) for n in nodes), i))
    return out


def _deep_tensors(tensors: Sequence[TensorCost], rep: Repeat) -> list[TensorCost] | None:
    """The deep model's crossing tensors, in graph order; None when they do not form a chain."""
    first, last, run, start = rep.first, rep.first + SHALLOW - 1, rep.layers.run, rep.layers.start
    before: list[TensorCost] = []
    within: list[list[TensorCost]] = [[] for _ in range(SHALLOW)]
    after: list[TensorCost] = []
    for t in tensors:
        into = {d - first for d in t.dsts if first <= d <= last}
        outside = tuple(rep.index(d) for d in t.dsts if not first <= d <= last)
        if t.src < first:
            if into not in (set(), {0}, set(range(SHALLOW))):
                return None
            layers = () if not into else (first,) if into == {0} else tuple(range(first, first + run))
            before.append(replace(t, name=rep.name(t.name), dsts=tuple(sorted((*outside, *layers)))))
        elif t.src > last:
            if into:
                return None
            after.append(replace(t, name=rep.name(t.name), src=rep.index(t.src), dsts=outside))
        else:
            s = t.src - first
            if not into <= {s + 1} or (outside and s != SHALLOW - 1):
                return None
            within[s].append(t)
    out = before
    for j in range(start, start + run):  # deep layer j is block first + j - start
        s = rep.layers.source(j) - start
        k = first + j - start
        for t in within[s]:
            dsts = tuple(k + 1 for d in t.dsts if d <= last) + tuple(rep.index(d) for d in t.dsts if d > last)
            out.append(replace(t, name=rep.name(t.name, j), src=k, dsts=dsts))
    return out + after
