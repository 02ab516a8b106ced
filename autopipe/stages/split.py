"""Split a traced model into one GraphModule per stage of a Plan.

Each stage module takes the values it reads from outside (model inputs and values made by
earlier stages, in a fixed order) and returns the values that later stages or the model's
output need. Skip connections go straight from the stage that makes a value to every stage
that reads it (``sends``) — not relayed through the stages in between.

Parameters shared between stages (a tied embedding and LM head) appear in each stage that
uses them as the model's one Parameter, so the stages of one rank share it and its gradient
accumulates every use there; each process keeps its own copy, so the executor sums their
gradients across the ranks that hold them, each rank's copy once, before every optimizer step
(``Split.shared_params``), which keeps the copies identical — the same result as one shared
parameter in the unsplit model.

Tests: tests/stages/test_emit.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from autopipe.errors import PlanError
from autopipe.graph.outputs import graph_outputs
from autopipe.graph.segment import Segment, extract
from autopipe.graph.trace import TracedModel
from autopipe.graph.training import follow_training_attention
from autopipe.plans import Plan

__all__ = ["OUTPUT", "Split", "StageModule", "split_model"]

OUTPUT = -2  # pseudo-stage: "the model's output" (assembled on the last stage)


@dataclass(frozen=True)
class StageModule:
    """One (virtual) stage: ``module(*inputs) -> tuple(outputs)``."""

    index: int
    rank: int
    module: torch.fx.GraphModule
    inputs: tuple[str, ...]  # value names, in argument order
    outputs: tuple[str, ...]  # value names, in result order
    sources: tuple[int, ...]  # per input: the stage that makes it, -1 for a model input
    sends: tuple[tuple[int, ...], ...]  # per output: the stages that read it (OUTPUT: model output)
    params: tuple[str, ...]  # parameter names (as in the original model) this stage uses


@dataclass(frozen=True)
class Split:
    """The stages of a plan, plus how the model's output and shared parameters are made."""

    stages: tuple[StageModule, ...]
    input_names: tuple[str, ...]  # the model's (flat) inputs
    output_names: tuple[str | None, ...]  # values that form the model output, flat, in order
    output_is_tuple: bool  # the traced graph returns a tuple (export) rather than one value
    shared_params: tuple[tuple[str, tuple[int, ...]], ...]  # parameter -> stages that use it

    @property
    def last(self) -> StageModule:
        return self.stages[-1]


def split_model(traced: TracedModel, plan: Plan) -> Split:
    """Cut ``traced`` into the stages of ``plan`` (the plan's nodes must be the trace's)."""
    gm = traced.gm
    by_name = {n.name: n for n in gm.graph.nodes}
    _check_nodes(traced, plan)
    stage_of = {name: s.index for s in plan.stages for name in s.nodes}
    output_names, output_is_tuple = graph_outputs(gm)
    last = len(plan.stages) - 1

    sizes = {n.name for n in gm.graph.nodes if _is_size(n)}
    stages = []
    for s in plan.stages:
        nodes = [n for n in s.nodes if n not in sizes]
        seg = extract(gm, nodes, keep=[o for o in output_names if o is not None and stage_of.get(o) == s.index])
        seg = _local_sizes(seg, by_name, s.index)
        follow_training_attention(seg.module)
        sources = tuple(stage_of.get(name, -1) if by_name[name].op != "placeholder" else -1 for name in seg.inputs)
        sends = tuple(_readers(by_name[name], stage_of, s.index, last) for name in seg.outputs)
        stages.append(
            StageModule(
                index=s.index,
                rank=s.rank,
                module=seg.module,
                inputs=seg.inputs,
                outputs=seg.outputs,
                sources=sources,
                sends=sends,
                params=_param_names(seg.module),
            )
        )
    # Shared means the same Parameter object (a tied weight may go by two names).
    canonical = {id(p): name for name, p in gm.named_parameters()}
    users: dict[str, list[int]] = {}
    for st in stages:
        for p in {id(p) for p in st.module.parameters()}:
            users.setdefault(canonical[p], []).append(st.index)
    shared = tuple(sorted((p, tuple(u)) for p, u in users.items() if len(u) > 1))
    return Split(tuple(stages), traced.input_names, output_names, output_is_tuple, shared)


def _is_size(node: torch.fx.Node) -> bool:
    """A symbolic size (a trace with symbolic shapes): computed in each stage, never sent."""
    return node.op == "call_function" and isinstance(
        node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)
    )


def _local_sizes(seg: Segment, by_name: dict[str, torch.fx.Node], index: int) -> Segment:
    """``seg`` with every symbolic size it reads computed from its own tensor inputs
    (``aten.sym_size.int(hidden, 0)`` for the batch), so only tensors cross stages."""
    g = seg.module.graph
    wanted = [name for name in seg.inputs if _is_size(by_name[name])]
    if not wanted:
        return seg
    # extract made one placeholder per input, in the inputs' order; its name can differ from the
    # value's where the graph already had that name (DeBERTa-v2: a value named like a module path)
    placeholders = dict(zip(seg.inputs, [n for n in g.nodes if n.op == "placeholder"], strict=True))
    tensors = [
        (placeholders[n], by_name[n].meta["val"])
        for n in seg.inputs
        if isinstance(by_name[n].meta.get("val"), torch.Tensor)
    ]
    first = next(n for n in g.nodes if n.op != "placeholder")
    for ph in placeholders.values():  # extract makes them as it meets them: all to the front
        first.prepend(ph)
    made: dict[str, Any] = {}

    def derive(o: torch.fx.Node) -> Any:
        if o.name in made:
            return made[o.name]
        v = o.meta.get("val")
        if not isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise PlanError(
                f"stage {index} cannot compute the size {o.name} from its inputs (it needs {o.name}, no size)"
            )
        expr = v.node.expr
        found = next(
            (
                (ph, d)
                for ph, t in tensors
                for d, s in enumerate(t.shape)
                if isinstance(s, torch.SymInt) and s.node.expr == expr
            ),
            None,
        )
        with g.inserting_before(first):
            if expr.is_number:
                result: Any = _constant(v)
            elif found is not None:
                result = g.call_function(torch.ops.aten.sym_size.int, found)
            elif o.op == "call_function":
                args = torch.fx.node.map_arg(o.args, derive)
                kwargs = torch.fx.node.map_arg(o.kwargs, derive)
                result = g.call_function(o.target, args, kwargs)  # type: ignore[arg-type]
            else:
                raise PlanError(
                    f"stage {index} cannot compute the size {o.name} from its inputs; emit from a static trace"
                )
        made[o.name] = result
        return result

    for name in wanted:
        ph = placeholders[name]
        value = derive(by_name[name])
        for user in list(ph.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a, ph=ph, value=value: value if a is ph else a)  # type: ignore[misc]
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, ph=ph, value=value: value if a is ph else a)  # type: ignore[misc]
        g.erase_node(ph)
    g.lint()
    seg.module.recompile()
    return Segment(seg.module, tuple(n for n in seg.inputs if n not in wanted), seg.outputs)


def _constant(v: torch.SymInt | torch.SymFloat | torch.SymBool) -> Any:
    if isinstance(v, torch.SymBool):
        return bool(v)
    return int(v) if isinstance(v, torch.SymInt) else float(v)


def _readers(node: torch.fx.Node, stage_of: dict[str, int], me: int, last: int) -> tuple[int, ...]:
    readers = {stage_of[u.name] for u in node.users if u.name in stage_of} - {me}
    if any(u.op == "output" for u in node.users):
        readers.add(OUTPUT if me == last else last)
    return tuple(sorted(readers, key=lambda r: (r == OUTPUT, r)))


def _param_names(module: torch.fx.GraphModule) -> tuple[str, ...]:
    return tuple(name for name, _ in module.named_parameters(remove_duplicate=False))


def _check_nodes(traced: TracedModel, plan: Plan) -> None:
    planned: Sequence[str] = [n for s in plan.stages for n in s.nodes]
    have = set(traced.block_of)
    if set(planned) != have or len(planned) != len(have):
        missing = sorted(have - set(planned))[:3]
        extra = sorted(set(planned) - have)[:3]
        raise PlanError(
            f"the plan does not match the traced model (unplanned nodes {missing}, unknown nodes {extra}); "
            "plan again from a profile of this model"
        )
    for s in plan.stages:
        order = [traced.block_of[n] for n in s.nodes]
        if not order:
            raise PlanError(f"stage {s.index} of the plan has no nodes; plan again")
