"""The model's output from a traced graph's flat outputs, as the model file's ``loss_fn`` sees it.

A traced graph ends in one output node. fx keeps the model's own structure (one tensor, or a
tuple); ``torch.export`` flattens it (a Hugging Face ``ModelOutput`` becomes a tuple of
leaves), so its structure is the output spec the export recorded (``gm.meta["out_spec"]``), or
else is recovered from one forward on fake tensors. The executor computes
the loss from these values on the last stage; the profilers price that loss on the last block.

Tests: tests/graph/test_trace.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["graph_outputs", "output_builder", "training_loss"]


def graph_outputs(gm: torch.fx.GraphModule) -> tuple[tuple[str | None, ...], bool]:
    """The names of the values the graph returns, flat and in order (``None`` for a constant),
    and whether it returns a tuple (rather than one value)."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    result = out_node.args[0]
    flat = list(result) if isinstance(result, (tuple, list)) else [result]
    return tuple(o.name if isinstance(o, torch.fx.Node) else None for o in flat), isinstance(result, (tuple, list))


def output_builder(
    gm: torch.fx.GraphModule, tracer: str, model: torch.nn.Module, inputs: object
) -> Callable[[list[Any]], object]:
    """Turn the graph's flat outputs back into what ``model(inputs)`` returns (for ``loss_fn``).

    ``inputs``: an example batch, used (on fake or meta tensors, nothing computed) only when an
    export trace flattened a structured output.
    """
    names, is_tuple = graph_outputs(gm)
    if tracer == "fx" or not is_tuple:
        if is_tuple:
            return tuple
        return lambda flat: flat[0]
    recorded = gm.meta.get("out_spec")  # recorded by the export trace
    if isinstance(recorded, torch.utils._pytree.TreeSpec) and recorded.num_leaves == len(names):
        return lambda flat: torch.utils._pytree.tree_unflatten(list(flat), recorded)
    try:  # export flattens the output: recover its structure from a forward that computes nothing
        from torch._subclasses.fake_tensor import FakeTensorMode

        from autopipe.model.load import call_model

        if any(p.is_meta for p in model.parameters()):  # on meta already (analytic planning)
            with torch.no_grad():
                out = call_model(model, inputs)
        else:
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            with mode, torch.no_grad():
                fake = torch.utils._pytree.tree_map(
                    lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, inputs
                )
                out = call_model(model, fake)
        leaves, spec = torch.utils._pytree.tree_flatten(out)
        if len(leaves) == len(names):
            return lambda flat: torch.utils._pytree.tree_unflatten(flat, spec)
    except Exception:  # the structure is a convenience; flat outputs still work
        # Running the model once more on fake tensors only recovers the output's structure
        # (a dict, a ModelOutput); when it cannot, loss_fn gets the flat outputs (one tensor
        # or a tuple), and a mismatch shows as loss_fn's own error, named by the caller.
        pass
    return (lambda flat: flat[0]) if len(names) == 1 else tuple


def training_loss(
    loaded: Any, traced: Any, model: torch.nn.Module, inputs: object, targets: object
) -> Callable[[list[Any]], torch.Tensor]:
    """The model file's ``loss_fn`` (``loaded``, a ``load.LoadedModel``) on the flat outputs of
    ``traced`` (a ``trace.TracedModel``), against ``targets``: the loss the executor computes
    on the last stage, for the profilers to price on the last block."""
    build = output_builder(traced.gm, traced.tracer, model, inputs)
    loss_fn: Callable[[object, object], torch.Tensor] = loaded.loss_fn

    def loss(flat: list[Any]) -> torch.Tensor:
        return loss_fn(build(flat), targets)

    return loss
