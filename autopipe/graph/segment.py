"""Cut a set of nodes out of an fx graph as a runnable GraphModule.

The profiler runs each block alone and the splitter runs each stage alone; both need the same
thing: a ``GraphModule`` that takes the values the nodes read from outside (in a fixed order)
and returns the values the nodes make that are read outside (or are model outputs). Parameters
and buffers (``get_attr`` nodes, leaf submodules) come along by reference.

Tests: tests/costs/test_counting.py.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch.fx

__all__ = ["Segment", "extract"]


@dataclass(frozen=True)
class Segment:
    """``module(*inputs) -> tuple(outputs)``, values named by the fx node that makes them."""

    module: torch.fx.GraphModule
    inputs: tuple[str, ...]  # outside values read, in first-use order
    outputs: tuple[str, ...]  # values made here and read outside, in graph order


def extract(gm: torch.fx.GraphModule, node_names: Collection[str], *, keep: Collection[str] = ()) -> Segment:
    """The nodes ``node_names`` of ``gm`` as a standalone module.

    ``keep`` names extra nodes of the set to return even when nothing outside reads them.
    """
    wanted = set(node_names)
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[str] = []
    for node in gm.graph.nodes:
        if node.name not in wanted:
            continue
        for a in node.all_input_nodes:
            if a in env:
                continue
            if a.op == "get_attr":
                env[a] = g.get_attr(str(a.target))
            elif a.name not in wanted:
                env[a] = g.placeholder(a.name)
                inputs.append(a.name)
        env[node] = g.node_copy(node, lambda a: env[a])
    outputs = [
        n.name
        for n in gm.graph.nodes
        if n.name in wanted and (n.name in keep or any(u.name not in wanted for u in n.users))
    ]
    by_name = {n.name: n for n in gm.graph.nodes}
    g.output(tuple(env[by_name[o]] for o in outputs))
    g.lint()
    return Segment(torch.fx.GraphModule(gm, g), tuple(inputs), tuple(outputs))
