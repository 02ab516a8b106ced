"""What each part of a layer saves for backward, and what recomputing or offloading a part keeps.

A block's count (``counting.count_block``) says what the whole block saves. Selective
recomputation and activation offload (``graph.units``) act on parts of it, and a part's saving
is not a sum: a tensor saved by two ops counts once, recomputing a module keeps its inputs, and
an output-discarding recompute frees a tensor that the next module saved. So the block's forward
is run once more, node by node (an fx ``Interpreter``, on the same meta tensors), recording per
node: its unit, the storages it reads, the storages its ops make, the storages autograd saves
while it runs (``saved_tensors_hooks``) and its ops' counts. :class:`Anatomy` holds that, and
:meth:`Anatomy.held` / :meth:`Anatomy.offloaded` answer from it exactly:

- a *region* of a module kind is a run of consecutive nodes whose units are the kind's
  (``graph.units.RECOMPUTE_KINDS``): one module call (one norm, the MLP, the attention core);
- recomputing kinds R keeps, per micro-batch: every storage saved by a node outside R's
  regions, and every region's inputs (storages a region reads and does not make: what its
  recomputation starts from); minus every storage made in a region of an output-discarding
  kind (``layernorm``, ``mlp_act``: Megatron-LM's ``CheckpointWithoutOutput`` frees the output the
  next module saved and makes it again before that module's backward). Its cost is the forward
  ops of R's regions, run again in the backward;
- offloading kinds O moves to the host each region's inputs that autograd saved and that only
  O's regions saved (Megatron-Core's fine-grained offload: "offload the input of the module").

With nothing recomputed, :meth:`Anatomy.held` is the block's saved bytes (the same storages
``timing.saved_bytes`` counts).

Tests: tests/costs/activations/test_anatomy.py.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode

from autopipe.costs.activations.choices import layer_options
from autopipe.costs.counting import OpCount, count_ops, leaf
from autopipe.costs.measure.timing import flat_inputs_of, storage_key
from autopipe.costs.profile import MemoryOption
from autopipe.costs.sdpa import fused_attention
from autopipe.graph.kinds import DISCARDING, OFFLOAD_KINDS, RECOMPUTE_KINDS
from autopipe.graph.segment import extract
from autopipe.graph.trace import TracedModel
from autopipe.graph.units import node_units

__all__ = ["Anatomy", "NodeFacts", "anatomy_of", "layer_anatomies", "options_of"]


@dataclass(frozen=True)
class NodeFacts:
    """One fx node of a block's forward, as it ran."""

    unit: str  # graph.units.UNITS, or "" for none
    reads: tuple[int, ...]  # storages of the tensors it takes (storage keys)
    made: tuple[int, ...]  # storages its ops made
    saves: tuple[int, ...]  # storages autograd saved for backward while it ran (parameters left out)
    ops: tuple[OpCount, ...]  # its forward ops


@dataclass(frozen=True)
class Anatomy:
    """A block's forward node by node: what each part reads, makes and saves (see the module docstring)."""

    nodes: tuple[NodeFacts, ...]
    nbytes: Mapping[int, int]  # storage key -> its bytes (every storage read, made or saved)

    def regions(self, kinds: Collection[str], table: Mapping[str, tuple[str, ...]]) -> list[tuple[str, range]]:
        """(kind, node range) of every region of ``kinds``: runs of consecutive nodes in the kind's units."""
        out: list[tuple[str, range]] = []
        for kind in sorted(kinds):
            units, start = set(table[kind]), None
            for i, n in enumerate((*self.nodes, None)):
                inside = n is not None and n.unit in units
                if inside and start is None:
                    start = i
                elif not inside and start is not None:
                    out.append((kind, range(start, i)))
                    start = None
        return out

    def _inputs(self, span: range) -> set[int]:
        made = {k for i in span for k in self.nodes[i].made}
        return {k for i in span for k in self.nodes[i].reads if k not in made}

    def held(self, recompute: Collection[str] = ()) -> int:
        """Bytes kept for backward per micro-batch when the kinds ``recompute`` are recomputed."""
        regions = self.regions(recompute, RECOMPUTE_KINDS)
        inside = {i for _, span in regions for i in span}
        kept = {k for i, n in enumerate(self.nodes) if i not in inside for k in n.saves}
        for _, span in regions:
            kept |= self._inputs(span)
        dropped = {k for kind, span in regions if kind in DISCARDING for i in span for k in self.nodes[i].made}
        return sum(self.nbytes[k] for k in kept - dropped)

    def saved(self) -> int:
        """Bytes autograd saves for backward with nothing recomputed (``held(())``)."""
        return self.held(())

    def recomputed(self, recompute: Collection[str]) -> tuple[OpCount, ...]:
        """The forward ops run again in the backward when ``recompute`` is recomputed."""
        regions = self.regions(recompute, RECOMPUTE_KINDS)
        return tuple(op for _, span in regions for i in span for op in self.nodes[i].ops)

    def offloaded(self, offload: Collection[str]) -> int:
        """Bytes moved to the host (and back) per micro-batch when the kinds ``offload`` are offloaded."""
        regions = self.regions(offload, OFFLOAD_KINDS)
        inside = {i for _, span in regions for i in span}
        saved_by: dict[int, set[int]] = {}
        for i, n in enumerate(self.nodes):
            for k in n.saves:
                saved_by.setdefault(k, set()).add(i)
        moved = {k for _, span in regions for k in self._inputs(span) if k in saved_by and saved_by[k] <= inside}
        return sum(self.nbytes[k] for k in moved)

    def has(self, kinds: Collection[str], table: Mapping[str, tuple[str, ...]]) -> bool:
        """Whether every kind of ``kinds`` has a region in this block."""
        found = {kind for kind, _ in self.regions(kinds, table)}
        return set(kinds) <= found


class _Storages(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the storages each op makes, under the node the interpreter is running."""

    def __init__(self, record: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.record = record

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.record(out)
        return out


class _Recorder(torch.fx.Interpreter):
    """Runs a block's segment node by node, recording :class:`NodeFacts` (unit by node name)."""

    def __init__(self, gm: torch.fx.GraphModule, units: Mapping[str, str], exclude: Collection[int]) -> None:
        super().__init__(gm)
        self.units, self.exclude = units, set(exclude)
        self.facts: list[NodeFacts] = []
        self.nbytes: dict[int, int] = {}
        self.alive: list[torch.Tensor] = []  # keeps every storage alive: no key is reused
        self.made: list[int] = []
        self.saves: list[int] = []

    def _keys(self, tree: Any, into: list[int] | None = None) -> list[int]:
        out = [] if into is None else into
        for t in torch.utils._pytree.tree_leaves(tree):
            if isinstance(t, torch.Tensor):
                k = storage_key(t)
                self.nbytes[k] = max(self.nbytes.get(k, 0), t.untyped_storage().nbytes())
                self.alive.append(t)
                if k not in self.exclude and k not in out:
                    out.append(k)
        return out

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        keys = self._keys(t)
        self.saves.extend(k for k in keys if k not in self.saves)
        return t

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op in ("placeholder", "output", "get_attr"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        reads = self._keys((args, kwargs))
        self.made, self.saves = [], []
        with count_ops() as ops, _Storages(lambda out: self._keys(out, self.made)):
            out = super().run_node(n)
        made = [k for k in self.made if k not in reads]
        self.facts.append(NodeFacts(self.units.get(n.name, ""), tuple(reads), tuple(made), tuple(self.saves), ops()))
        return out


def anatomy_of(
    module: torch.fx.GraphModule, args: Sequence[Any], units: Mapping[str, str], exclude: Collection[int] = ()
) -> Anatomy:
    """Run ``module(*args)`` (a block's segment, on tensors made autograd leaves by the caller)
    node by node and record its :class:`Anatomy`; ``units``: node name -> unit
    (``graph.units.node_units``); ``exclude``: storage keys of parameters."""
    return _run(module, args, units, exclude)[0]


def _run(
    module: torch.fx.GraphModule, args: Sequence[Any], units: Mapping[str, str], exclude: Collection[int]
) -> tuple[Anatomy, Any]:
    recorder = _Recorder(module, units, exclude)
    with fused_attention(), torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t):
        out = recorder.run(*args)
    return Anatomy(tuple(recorder.facts), dict(recorder.nbytes)), out


def layer_anatomies(traced: TracedModel, model: torch.nn.Module, inputs: Any) -> tuple[Anatomy | None, ...]:
    """Each block's :class:`Anatomy` (None for a block that is no layer), running the traced model
    block by block on ``inputs`` (real tensors: the measured profiler's; nothing else is kept)."""
    gm = traced.gm
    units = node_units(gm, model, [b.nodes for b in traced.blocks])
    exclude = {storage_key(p) for p in gm.parameters()}
    env: dict[str, Any] = dict(zip(traced.input_names, flat_inputs_of(traced, inputs), strict=True))
    out: list[Anatomy | None] = []
    for block in traced.blocks:
        seg = extract(gm, block.nodes)
        args = [env[name] for name in seg.inputs]
        if any(n in units for n in block.nodes):
            anatomy, outs = _run(seg.module, [leaf(a) for a in args], units, exclude)
        else:
            anatomy = None
            with torch.no_grad():
                outs = seg.module(*args)
        env.update(zip(seg.outputs, (o.detach() if isinstance(o, torch.Tensor) else o for o in outs), strict=True))
        out.append(anatomy)
    return tuple(out)


def options_of(
    found: Mapping[float, tuple[Anatomy, float]],
    seconds: Callable[[Sequence[OpCount], float], float],
    flops: Callable[[Sequence[OpCount]], float],
    scaled: Callable[[float], float] = float,
) -> tuple[MemoryOption, ...]:
    """A layer's :class:`~autopipe.costs.profile.MemoryOption` s (``costs.activations.choices.layer_options``)
    from its anatomy and saved bytes at each micro-batch size (``found``: size -> both):
    the bytes a choice keeps are the block's saved bytes less what the anatomy says it frees;
    ``seconds(ops, u)`` prices recomputed ops, ``flops(ops)`` counts them, ``scaled`` maps bytes
    to one device's share (tensor parallelism)."""

    def held(kinds: tuple[str, ...], u: float) -> float:
        a, saved = found[u]
        return scaled(max(0.0, saved - a.saved() + a.held(kinds)))

    def recomputed(kinds: tuple[str, ...], u: float) -> tuple[float, float]:
        again = found[u][0].recomputed(kinds)
        return seconds(again, u), flops(again)

    def offloaded(kinds: tuple[str, ...], u: float) -> float:
        return scaled(float(found[u][0].offloaded(kinds)))

    def has(kinds: tuple[str, ...], offload: bool) -> bool:
        return all(a.has(kinds, OFFLOAD_KINDS if offload else RECOMPUTE_KINDS) for a, _ in found.values())

    return layer_options(held, recomputed, offloaded, has, sorted(found))
