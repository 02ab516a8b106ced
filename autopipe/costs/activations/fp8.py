"""What a layer saves for backward when its linear layers run in FP8 (Transformer Engine).

Transformer Engine's ``Linear`` (and the linear halves of ``LayerNormLinear`` / ``LayerNormMLP``)
casts its input to FP8 for the forward GEMM and keeps that FP8 tensor for the weight-gradient GEMM
of the backward, one byte an element, not the 16-bit input: ``transformer_engine/pytorch/module/
linear.py``, ``_Linear.forward``: ``saved_inputmat = inputmat`` (the FP8 cast) when ``fp8``, else
``inputmat_no_fp8``; with sequence parallelism the local FP8 shard (TE 1.x, ``if fp8_enabled and
sequence_parallel: saved_inputmat = inputmat``); TE 2.x keeps the quantized input's column-wise
FP8 data (``saved_inputmat = inputmat`` after ``update_usage(rowwise_usage=False,
columnwise_usage=True)``). A tensor another op saves as well is kept by that op in its own dtype
beside the FP8 copy (flash attention's output, which the output projection reads, stays bf16 for
attention's backward).

So :func:`saved_bytes_fp8_linears` counts, like ``timing.saved_bytes``, every storage autograd
saves once, but a storage saved by a linear layer (``F.linear``) at one byte an element, and a
storage saved both by a linear layer and by another op at both sizes. Megatron-Core runs only its
transformer layers under FP8 (``get_fp8_context`` around each layer; the output layer is a
bf16 ``ColumnParallelLinear``): the analytic count applies this to the layer blocks alone.

Tests: tests/costs/test_activation_reference.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autopipe.costs.measure.timing import storage_key

__all__ = ["saved_bytes_fp8_linears"]


class _InLinear(TorchFunctionMode):
    """Marks while a ``F.linear`` call runs (its autograd saves happen inside it)."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.linear:
            return func(*args, **kwargs)
        self.depth += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.depth -= 1


def saved_bytes_fp8_linears(fn: Callable[[], object], exclude: set[int] | frozenset[int] = frozenset()) -> int:
    """Bytes autograd saves for backward while ``fn()`` runs, the linear layers' saved inputs at
    one byte an element (FP8), every other saved storage at its own size (module docstring);
    storages in ``exclude`` (parameters) do not count."""
    mode = _InLinear()
    other: dict[int, int] = {}
    linear: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in exclude:
            nbytes = t.untyped_storage().nbytes()
            if mode.depth:
                linear[key] = max(linear.get(key, 0), nbytes // max(t.element_size(), 1))
            else:
                other[key] = max(other.get(key, 0), nbytes)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), mode:
        out = fn()
    del out
    return sum(other.values()) + sum(linear.values())
