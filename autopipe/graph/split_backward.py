"""Split backward for zero-bubble schedules: input gradients now (B), weight gradients later (W).

Zero Bubble Pipeline Parallelism (Qi et al., 2023) splits a stage's backward into B, the
gradients of the stage's inputs (which the previous stage waits for), and W, the gradients of
its parameters (which nobody waits for, so W fills bubbles). For a linear layer ``y = x A^T``
with output gradient ``dy``: B is ``dx = dy A``, W is ``dA = dy^T x``.

On the autograd graph that hangs from the stage's roots (its outputs and the loss)::

    roots ──▶ ... ──▶ I ──▶ ... ──▶ received input        E: every node on a path from a
                      │                                      root to a received input (what
                      └──▶ ... ──▶ parameter                 B runs: autograd.grad to inputs)

``E`` is closed towards the roots (a node that reaches a node of E is in E), so every path
from a root to a parameter leaves E exactly once, at a *boundary* node ``I`` (the last node of
E on the path). :func:`backward_input` runs B with a pre-hook on each boundary node that keeps
the gradient flowing into it (``dy`` above); :meth:`WeightGrad.run` restarts autograd at
those nodes (``GradientEdge``) with the kept gradients, asking only for the parameters, so W
runs only the weight-gradient kernels, not the input-gradient chain again. Paths that never
touch E (from a root no input depends on: every path of a first stage, whose inputs need no
gradient) start at that root with its own gradient.

Exactness: W sums, over all paths from the roots to a parameter, the same node backward
functions a full backward would call (only the order of additions can differ). Parameters
whose paths share boundary nodes or roots are one group (one ``autograd.grad`` call); when
one boundary node of a group lies below another, autograd would reach it twice (once as a
start, once from above), so during W each boundary node's incoming gradient is replaced by
the value kept in B (which already is the sum over every path to it) -- no path counts twice.
``torch.distributed.pipelining`` (``stage_backward_input`` / ``stage_backward_weight``) takes
the same approach.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, Node

__all__ = ["WeightGrad", "backward_input"]


def _node(t: torch.Tensor) -> Node | None:
    """The autograd node gradients of ``t`` flow into (its grad_fn, or its accumulator)."""
    if t.grad_fn is not None:
        return t.grad_fn
    if not t.requires_grad:
        return None
    fn = t.view_as(t).grad_fn  # a leaf's accumulator is made lazily: reach it through a view
    return fn.next_functions[0][0] if fn is not None else None


def _parents(roots: Sequence[Node]) -> dict[Node, list[Node]]:
    """node -> the nodes whose backward feeds it, over the graph below ``roots``."""
    parents: dict[Node, list[Node]] = {r: [] for r in roots}
    queue = deque(dict.fromkeys(roots))
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            if child not in parents:
                parents[child] = []
                queue.append(child)
            parents[child].append(node)
    return parents


def _closure(start: Sequence[Node], parents: dict[Node, list[Node]]) -> set[Node]:
    """``start`` and every node above it (towards the roots)."""
    seen = set(start)
    queue = deque(seen)
    while queue:
        for p in parents[queue.popleft()]:
            if p not in seen:
                seen.add(p)
                queue.append(p)
    return seen


@dataclass(eq=False)
class _Group:
    params: list[torch.Tensor]
    boundary: list[Node]
    roots: list[int]  # indices of roots outside E that reach the group's parameters
    kept: dict[Node, tuple[torch.Tensor | None, ...]] = field(default_factory=dict)


@dataclass
class WeightGrad:
    """The W half of a split backward: :meth:`run` adds the parameter gradients to ``.grad``."""

    groups: list[_Group]
    roots: Sequence[torch.Tensor]
    grads: Sequence[torch.Tensor | None]

    def run(self) -> None:
        for g in self.groups:
            outputs: list[Any] = []
            seeds: list[torch.Tensor | None] = []
            for node in g.boundary:
                for k, grad in enumerate(g.kept.get(node, ())):
                    if grad is not None:
                        outputs.append(GradientEdge(node, k))
                        seeds.append(grad)
            for r in g.roots:
                outputs.append(self.roots[r])
                seeds.append(self.grads[r])
            if not outputs:
                continue
            hooks = [n.register_prehook(_replace_with(g.kept[n])) for n in g.boundary if n in g.kept]
            try:  # into .grad as each is made (not all of the group's at once, then added)
                torch.autograd.backward(outputs, seeds, retain_graph=True, inputs=g.params)
            finally:
                for h in hooks:
                    h.remove()
        self.groups = []


def _replace_with(kept: tuple[torch.Tensor | None, ...]) -> Any:
    def hook(grad_outputs: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor | None, ...]:
        return kept

    return hook


def _keep(group: _Group, node: Node) -> Any:
    def hook(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
        group.kept[node] = tuple(grad_outputs)

    return hook


def backward_input(
    roots: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor | None],
    inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
) -> tuple[list[torch.Tensor | None], WeightGrad]:
    """B: gradients of ``inputs`` (None where unused); W is the returned :class:`WeightGrad`.

    ``roots``/``grads`` as for ``torch.autograd.backward`` (a None gradient for a scalar
    loss). The graph is kept for W (``retain_graph``); it is freed when the roots are.
    """
    if not any(x.requires_grad for x in inputs):  # a first stage: nothing for B, W is all
        everything = _Group(list(params), [], [k for k, r in enumerate(roots) if r.requires_grad])
        return [None] * len(inputs), WeightGrad([everything] if everything.roots else [], roots, grads)
    root_nodes = [_node(r) for r in roots]
    parents = _parents([n for n in root_nodes if n is not None])
    input_nodes = [n for n in (_node(x) for x in inputs) if n is not None and n in parents]
    in_e = _closure(input_nodes, parents)
    root_index: dict[Node, list[int]] = {}
    for k, n in enumerate(root_nodes):
        if n is not None and n not in in_e:
            root_index.setdefault(n, []).append(k)
    # walk up from each parameter's accumulator to the boundary of E
    owner: dict[Any, _Group] = {}  # boundary node or ("root", k) -> group
    groups: list[_Group] = []
    for p in params:
        acc = _node(p)
        if acc is None or acc not in parents:
            continue  # unused by this stage's graph
        boundary: dict[Node, None] = {}  # ordered: the same graph gives the same order
        seeds: set[int] = set()
        seen, queue = {acc}, deque([acc])
        while queue:
            node = queue.popleft()
            seeds.update(root_index.get(node, ()))
            for q in parents[node]:
                if q in in_e:
                    boundary[q] = None
                elif q not in seen:
                    seen.add(q)
                    queue.append(q)
        keys: list[Any] = [*boundary, *(("root", k) for k in seeds)]
        mine = {id(owner[k]): owner[k] for k in keys if k in owner}
        group = _Group([p], list(boundary), sorted(seeds))
        for other in mine.values():  # merge the groups this parameter connects
            group.params = other.params + group.params
            group.boundary = list(dict.fromkeys(other.boundary + group.boundary))
            group.roots = sorted(set(other.roots) | set(group.roots))
            groups = [g for g in groups if g is not other]
        groups.append(group)
        for key in [*group.boundary, *(("root", r) for r in group.roots)]:
            owner[key] = group
    hooks = [n.register_prehook(_keep(g, n)) for g in groups for n in g.boundary]
    try:
        wanted = [x for x, n in zip(inputs, (_node(x) for x in inputs), strict=True) if n in parents]
        got: dict[int, torch.Tensor | None] = {}
        if wanted:
            out = torch.autograd.grad(list(roots), wanted, list(grads), retain_graph=True, allow_unused=True)
            got = {id(x): g for x, g in zip(wanted, out, strict=True)}
    finally:
        for h in hooks:
            h.remove()
    # W restarts from the kept gradients and from the roots outside E only: the others' gradients
    # (a stage's received ones) are let go after B, not held until W
    needed = {r for g in groups for r in g.roots}
    return [got.get(id(x)) for x in inputs], WeightGrad(
        groups, roots, [g if k in needed else None for k, g in enumerate(grads)]
    )
