"""torch's ``PipelineStage`` with autopipe's split backward (issue 27).

torch's zero-bubble schedules (ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble,
ScheduleDualPipeV, a CSV with ``I`` and ``W`` actions) call
``backward_one_chunk(full_backward=False)`` for the input-gradient half and
``backward_weight_one_chunk`` for the weight half; both go through
``backward_maybe_with_nosync("input" | "weight", ...)``, which runs torch's
``stage_backward_input`` / ``stage_backward_weight`` (torch/distributed/pipelining/_backward.py).
On real graphs those fail: ``stage_backward_input`` detaches the stage's outputs in place after
the input half (the weight half of a parameter whose path starts at an output no input reaches
then has no graph: "Failed to run stage backward input", "Trying to backward through the graph a
second time"), and the input gradients it returns are sent as they come (a permuted or expanded
gradient: gloo's "input tensor has to be contiguous").

:class:`SplitBackwardStage` keeps torch's stage and schedules and replaces those two halves with
:func:`autopipe.graph.split_backward.backward_input` and its :class:`WeightGrad` -- autopipe's own
engine's split, which keeps every node the weight half needs (the graph is freed with the
roots, after W) -- and makes every input gradient contiguous before torch sends it or hands it
to a stage of the same rank. A parameter two stages of one rank share is one Parameter: each
stage's weight half adds its share to its ``.grad``.

Tests: tests/stages/test_torch_stage.py (one process), tests/stages/test_zero_bubble_export.py
(2 gloo ranks, every hf_zoo architecture under ZB-H1, ZB-V and DualPipeV).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage

from autopipe.graph.split_backward import WeightGrad, backward_input

__all__ = ["SplitBackwardStage"]


class SplitBackwardStage(PipelineStage):
    """A ``PipelineStage`` whose input/weight split backward is autopipe's (module docstring)."""

    def backward_maybe_with_nosync(
        self, backward_type: str, bwd_kwargs: dict[str, Any], last_backward: bool = False
    ) -> tuple[tuple[torch.Tensor | None, ...], list[Any] | None]:
        if backward_type == "input":
            grads, weight = _backward_input(self.submod, bwd_kwargs)
            return grads, [weight]
        if backward_type == "weight":
            for weight in bwd_kwargs["param_groups"] or ():
                weight.run()
            return (), None
        grads, groups = super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        return tuple(_contiguous(g) for g in grads), groups


def _backward_input(
    submod: torch.nn.Module, bwd_kwargs: dict[str, Any]
) -> tuple[tuple[torch.Tensor | None, ...], WeightGrad]:
    """The input gradients (contiguous) of one micro-batch and the weight half that finishes it."""
    outputs = bwd_kwargs["stage_output"]
    outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
    given = bwd_kwargs["output_grads"]
    seeds = (None,) * len(outputs) if given is None else tuple(given)
    roots, grads = [], []
    for out, grad in zip(outputs, seeds, strict=True):
        # an output without a graph, or one the next stage sent no gradient for, adds nothing
        if isinstance(out, torch.Tensor) and out.requires_grad and (grad is not None or out.numel() == 1):
            roots.append(out)
            grads.append(grad)
    values = list(bwd_kwargs["input_values"])
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    params = list({id(p): p for p in submod.parameters() if p.requires_grad}.values())
    got, weight = backward_input(roots, grads, tensors, params)
    by_id = {id(t): g for t, g in zip(tensors, got, strict=True)}
    return tuple(_contiguous(by_id.get(id(v))) if isinstance(v, torch.Tensor) else None for v in values), weight


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.is_contiguous() else t.contiguous()
