"""Shape propagation on meta tensors that runs each distinct leaf-module call once.

A deep model of identical layers calls the same leaf modules (``Linear``, ``LayerNorm``, ...)
and functions (attention, ``+``) on inputs of the same shapes layer after layer, and torch runs
the Python decomposition of each on meta every time (GPT-3 175B: 1,700 module calls, half its
tracing time). A call of one of :data:`SHAPE_ONLY` (whose output's shape, strides and dtype
follow from its type, its settings, its parameters' shapes and its inputs' layout alone) or
of :data:`SHAPE_ONLY_FUNCTIONS` (from its inputs' layouts and its constant arguments) is keyed
by exactly those, and a repeated key gets a new meta tensor of the recorded layout in its own
storage. Any other
node, a call with a non-tensor or non-meta input, or one whose output shares an input's or a
parameter's storage (an in-place or identity module) is run as before.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["SHAPE_ONLY", "SHAPE_ONLY_FUNCTIONS", "MetaShapes"]

SHAPE_ONLY: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.LayerNorm,
    nn.RMSNorm,
    nn.Embedding,
    nn.Dropout,
    nn.GELU,
    nn.SiLU,
    nn.ReLU,
    nn.Tanh,
)

SHAPE_ONLY_FUNCTIONS: frozenset[Any] = frozenset(
    {
        F.scaled_dot_product_attention,
        F.gelu,
        F.silu,
        F.softmax,
        F.dropout,
        operator.add,
        operator.mul,
        torch.add,
        torch.mul,
    }
)
"""Functions whose output (a new tensor) follows from their inputs' layouts and constant arguments."""

_CONSTANT = (int, float, bool, str, type(None))


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
        if n.op == "call_module":
            module = self.fetch_attr(str(n.target))
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            key = _key(module, args, kwargs)
        elif n.op == "call_function" and n.target in SHAPE_ONLY_FUNCTIONS:
            module = None
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            key = _function_key(n.target, args, kwargs)
        else:
            return super().run_node(n)
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
            self.memo[key] = _own(result, module, (*args, *kwargs.values()))
        return result


def _key(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    if type(module) not in SHAPE_ONLY or kwargs:
        return None
    if not args or not all(isinstance(a, torch.Tensor) and a.is_meta for a in args):
        return None
    state = tuple((name, _layout(t)) for name, t in (*module.named_parameters(), *module.named_buffers()))
    return (type(module), module.extra_repr(), module.training, state, tuple(_layout(a) for a in args))


def _function_key(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    values = (*args, *kwargs.values())
    if not any(isinstance(a, torch.Tensor) for a in values):
        return None
    if not all(isinstance(a, _CONSTANT) or (isinstance(a, torch.Tensor) and a.is_meta) for a in values):
        return None

    def item(a: Any) -> Any:
        return ("tensor", _layout(a)) if isinstance(a, torch.Tensor) else (type(a).__name__, a)

    return (fn, tuple(item(a) for a in args), tuple(sorted((k, item(v)) for k, v in kwargs.items())))


def _own(result: Any, module: nn.Module | None, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The layout of ``result`` when it is one meta tensor in a storage of its own, else None."""
    if not isinstance(result, torch.Tensor) or not result.is_meta:
        return None
    state = () if module is None else (*module.parameters(), *module.buffers())
    tensors = [t for t in (*args, *state) if isinstance(t, torch.Tensor)]
    others = {int(t.untyped_storage()._cdata) for t in tensors}
    if int(result.untyped_storage()._cdata) in others or result.untyped_storage().nbytes() % result.element_size():
        return None
    return _layout(result)
