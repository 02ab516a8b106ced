"""Building a model on the meta device without running its weight initialisers.

A tensor on meta has a shape and a dtype but no values, so filling it in place (``normal_``,
``uniform_``, ``zero_``, ``fill_`` and the ``torch.nn.init`` functions ``reset_parameters``
calls) changes nothing; torch still runs the Python decomposition of each fill for meta (and
imports ``torch._dynamo`` for the first one: 1.5 s of GPT-3 175B's 2 s build on meta). Under
:class:`SkipMetaFills` those calls return their meta tensor at once (the Kaiming and Xavier
ones after their check of the tensor's dimensions); a fill of any other tensor runs as usual.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["SkipMetaFills"]

_TENSOR_FILLS = frozenset(
    getattr(torch._C.TensorBase, name)
    for name in ("normal_", "uniform_", "zero_", "fill_", "random_", "bernoulli_", "exponential_", "log_normal_")
)
"""In-place fills of a tensor: they keep its shape, dtype and strides and only write values."""

_INIT_FILLS = frozenset(
    {
        torch.nn.init.normal_,
        torch.nn.init.uniform_,
        torch.nn.init.trunc_normal_,
        torch.nn.init.constant_,
        torch.nn.init.ones_,
        torch.nn.init.zeros_,
    }
)
"""``torch.nn.init`` fills that accept a tensor of any shape."""

_FAN_FILLS = frozenset(
    {
        torch.nn.init.kaiming_uniform_,
        torch.nn.init.kaiming_normal_,
        torch.nn.init.xavier_uniform_,
        torch.nn.init.xavier_normal_,
    }
)
"""``torch.nn.init`` fills that first compute the tensor's fans (and refuse fewer than 2 dimensions)."""


class SkipMetaFills(TorchFunctionMode):
    """While active, an in-place fill of a meta tensor returns the tensor without running."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _TENSOR_FILLS or func in _INIT_FILLS or func in _FAN_FILLS:
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                if func in _FAN_FILLS:
                    torch.nn.init._calculate_fan_in_and_fan_out(tensor)  # its one check: at least 2 dimensions
                return tensor
        return func(*args, **kwargs)
