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

Casts (:func:`cast_ops`). Each FP8 linear also runs Transformer Engine's cast kernels, memory-bound
ops priced at the memory bandwidth like any other: ``_Linear.forward`` casts its bf16 input with
``fp8_cast_transpose_fused`` (the FP8 copy for the forward GEMM and its transpose for the weight
gradient: read 2 bytes, write 1 + 1 an element), and ``backward`` runs ``grad_output_preprocess``
(``module/base.py``), which casts the output gradient the same way (``fp8_cast_transpose_fused``)
for the data- and the weight-gradient GEMMs. The weights are cast once per step, not per
micro-batch (``update_fp8_weights = is_first_microbatch is None or is_first_microbatch``; Megatron
passes ``is_first_microbatch``), and the amax/scale bookkeeping touches a few scalars per tensor:
neither is counted here. Each cast is its own kernel (``kind`` ``"eager"``: ``costs.fusion`` does not
merge it into a neighbour's run).

Tests: tests/costs/test_fp8_casts.py.
(The saved bytes also in tests/costs/test_activation_reference.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autopipe.costs.measure.timing import storage_key

__all__ = ["CAST_BYTES_PER_ELEMENT", "cast_ops", "saved_bytes_fp8_linears"]

# fp8_cast_transpose_fused: read the bf16 element (2 bytes), write its FP8 cast (1) and the cast transposed (1).
CAST_BYTES_PER_ELEMENT = 2 + 1 + 1


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


def cast_ops(forward: Sequence[Any]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The bytes of the FP8 casts of the linear layers among ``forward`` (a block's counted
    forward ops, ``costs.counting.OpCount``: a ``"linear"`` GEMM of dims (M, K, N) reads an (M, K)
    input and writes an (M, N) output): the forward's input casts (M K elements each, one per
    input: linears that read one tensor, as the model's separate q, k, v projections do, are one
    linear in Megatron-Core, ``linear_qkv``, and cast it once) and the backward's output-gradient
    casts (M N each: the fused linear's output gradient is theirs side by side), one memory-bound
    op per cast at :data:`CAST_BYTES_PER_ELEMENT` bytes an element (module docstring); the
    caller makes them ops (``costs.counting``, kind ``"eager"``)."""
    linears = [op for op in forward if op.kind == "linear" and len(op.dims) == 3]
    inputs: dict[object, float] = {}  # one cast per input: Megatron's fused QKV and fc1 (gate + up) are one linear each
    for op in linears:
        m, k, _ = op.dims
        inputs.setdefault(op.reads[0][0] if op.reads else id(op), m * k)
    fwd = tuple(CAST_BYTES_PER_ELEMENT * n for n in inputs.values())
    bwd = tuple(CAST_BYTES_PER_ELEMENT * m * n for m, _, n in (op.dims for op in linears))
    return fwd, bwd
