"""Shape propagation on meta tensors that runs each distinct leaf-module call once.

A deep model of identical layers calls the same leaf modules (``Linear``, ``LayerNorm``, ...)
on inputs of the same shapes layer after layer, and torch runs the Python decomposition of
each on meta every time (GPT-3 175B: 1,700 module calls, half its tracing time). A call of one
of :data:`SHAPE_ONLY` (whose output's shape, strides and dtype follow from its type, its
settings, its parameters' shapes and its inputs' layout alone) is keyed by exactly those, and
a repeated key gets a new meta tensor of the recorded layout in its own storage. Any other
node, a call with a non-tensor or non-meta input, or one whose output shares an input's or a
parameter's storage (an in-place or identity module) is run as before.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["SHAPE_ONLY", "MetaShapes"]

SHAPE_ONLY: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.LayerNorm, nn.RMSNorm, nn.Embedding, nn.Dropout, nn.GELU, nn.SiLU, nn.ReLU, nn.Tanh,
)  # fmt: skip


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.untyped_storage().nbytes(), t.requires_grad)


class MetaShapes(torch.fx.Interpreter):
    """Record each node's value in ``node.meta['val']`` (meta inputs), reusing repeated calls."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.memo: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}
        self.reused = 0

    def run_node(self, n: torch.fx.Node) -> Any:
        with torch.no_grad():
            result = self._call(n)
        n.meta["val"] = result
        return result

    def _call(self, n: torch.fx.Node) -> Any:
        if n.op != "call_module":
            return super().run_node(n)
        module = self.fetch_attr(str(n.target))
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        key = _key(module, args, kwargs)
        if key is None:
            return super().run_node(n)
        layout = self.memo.get(key)
        if layout is not None:
            self.reused += 1
            shape, stride, offset, dtype, nbytes, _ = layout
            base = torch.empty(nbytes, dtype=torch.uint8, device="meta").view(dtype)
            return base.as_strided(shape, stride, offset)
        result = super().run_node(n)
        if key not in self.memo:
            self.memo[key] = _own(result, module, args)
        return result


def _key(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    if type(module) not in SHAPE_ONLY or kwargs:
        return None
    if not args or not all(isinstance(a, torch.Tensor) and a.is_meta for a in args):
        return None
    state = tuple((name, _layout(t)) for name, t in (*module.named_parameters(), *module.named_buffers()))
    return (type(module), module.extra_repr(), module.training, state, tuple(_layout(a) for a in args))


def _own(result: Any, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The layout of ``result`` when it is one meta tensor in a storage of its own, else None."""
    if not isinstance(result, torch.Tensor) or not result.is_meta:
        return None
    others = {int(t.untyped_storage()._cdata) for t in (*args, *module.parameters(), *module.buffers())}
    if int(result.untyped_storage()._cdata) in others or result.untyped_storage().nbytes() % result.element_size():
        return None
    return _layout(result)
