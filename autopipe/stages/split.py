"""Split a traced model into one GraphModule per stage of a Plan.

Each stage module takes the values it reads from outside (model inputs and values made by
earlier stages, in a fixed order) and returns the values that later stages or the model's
output need. Skip connections go straight from the stage that makes a value to every stage
that reads it (``sends``) — not relayed through the stages in between.

Parameters shared between stages (a tied embedding and LM head) appear in each stage that
uses them; each process keeps its own copy, so the executor sums their gradients across the
stages that hold them before every optimizer step (``Split.shared_params``), which keeps the
copies identical — the same result as one shared parameter in the unsplit model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch.fx

from autopipe.errors import PlanError
from autopipe.graph.outputs import graph_outputs
from autopipe.graph.segment import extract
from autopipe.graph.trace import TracedModel
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

    stages = []
    for s in plan.stages:
        seg = extract(gm, s.nodes, keep=[o for o in output_names if o is not None and stage_of.get(o) == s.index])
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
