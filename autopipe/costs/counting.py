"""Count what one block of a model does, op by op, without running it: FLOPs and bytes.

The analytic cost model runs each block's segment (``graph/segment.py``) on the meta device —
shapes only, nothing allocated — forward and backward, under a ``TorchDispatchMode`` that
records every aten op it dispatches:

- FLOPs by the formulas of ``torch.utils.flop_counter`` (the ones ``FlopCounterMode`` uses:
  matmuls, convolutions, attention; pointwise ops count zero), with the same decomposition
  rule, so the totals equal ``FlopCounterMode``'s;
- bytes moved: every tensor the op reads plus every tensor it writes, each at most its
  storage's size (a broadcast operand is read once); views and aliases move nothing. This is
  the ideal traffic of one kernel per op (no fusion, no cache reuse across ops).

Bytes saved for backward come from the measured profiler's own ``profile.saved_bytes`` (the
``saved_tensors_hooks`` count), so both profiles count them by one code path.

Attention: on the meta device ``scaled_dot_product_attention`` would take the unfused math
path and save the (T x T) attention matrix; the fused kernels a GPU (and this CPU) run save
only q, k, v, the output and the log-sum-exp. :func:`fused_attention` routes it to the fused
op so meta counts match real runs; the fused backward recomputes the scores, which its FLOP
formula (Dao et al. 2022, FlashAttention) includes: 2.5x the forward, not 2x.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from autopipe.costs.devices import DeviceSpec
from autopipe.costs.timing import saved_bytes

__all__ = [
    "BlockCount",
    "OpCount",
    "block_time",
    "count_block",
    "count_loss",
    "count_ops",
    "fused_attention",
    "leaf",
    "op_dtype",
    "op_time",
]

aten = torch.ops.aten


@dataclass(frozen=True)
class OpCount:
    """One aten op: floating-point operations and bytes read plus written; a GEMM also says
    what it is (``kind``: ``"linear"`` for ``mm`` / ``addmm``, the linear layers' kernels, or
    ``"bmm"`` for batched ones) and its ``dims`` (M, K, N), whose ``size`` prices its efficiency
    (``DeviceSpec.efficiency``)."""

    flops: float
    bytes: float
    kind: str = ""  # "linear", "bmm" or "" (not a GEMM)
    dims: tuple[float, ...] = ()  # a GEMM's (M, K, N); () for any other op

    @property
    def size(self) -> float:
        """The GEMM's size: the side of the square GEMM of as many FLOPs, ``(M K N) ** (1/3)``; 0 for
        an op that is not a GEMM. Not the smallest dimension: a thin GEMM's low arithmetic
        intensity is the roofline's memory term already; what the curve adds is the tile and
        wave quantization of a small problem, which goes with its work."""
        return float(math.prod(self.dims)) ** (1.0 / 3.0) if self.dims else 0.0


@dataclass(frozen=True)
class BlockCount:
    """One block at one micro-batch size, counted on the meta device."""

    forward: tuple[OpCount, ...]
    backward: tuple[OpCount, ...]  # full backward: input and weight gradients
    backward_input: tuple[OpCount, ...]  # input gradients only (zero-bubble "B")
    saved_bytes: int  # saved for backward, parameters excluded

    @property
    def forward_flops(self) -> float:
        return sum(op.flops for op in self.forward)

    @property
    def backward_flops(self) -> float:
        return sum(op.flops for op in self.backward)


def _cpu_flash_flops(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return int(sdpa_flop_count(q, k, v))  # type: ignore[no-untyped-call]


def _cpu_flash_backward_flops(g: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return int(sdpa_backward_flop_count(g, q, k, v))  # type: ignore[no-untyped-call]


# The CPU fused attention ops have no formula in torch's registry; they do what the CUDA ones do.
_CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu
_CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward
if _CPU_FLASH not in flop_registry:
    register_flop_formula(_CPU_FLASH)(_cpu_flash_flops)
if _CPU_FLASH_BACKWARD not in flop_registry:
    register_flop_formula(_CPU_FLASH_BACKWARD)(_cpu_flash_backward_flops)

_QUERIES = {
    aten.sym_is_contiguous.default,
    aten.is_contiguous.default,
    aten.is_contiguous.memory_format,
    aten.is_strides_like_format.default,
    aten.is_non_overlapping_and_dense.default,
    aten.size.default,
    aten.sym_size.default,
    aten.stride.default,
    aten.sym_stride.default,
    aten.storage_offset.default,
    aten.sym_storage_offset.default,
    aten.numel.default,
    aten.sym_numel.default,
    aten.dim.default,
    torch.ops.prim.layout.default,
    torch.ops.prim.device.default,
}
_ALIASES = {aten._unsafe_view, aten.detach, aten.alias, aten.lift_fresh}


def _tensor_bytes(tree: Any) -> float:
    total = 0.0
    for t in torch.utils._pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor):
            total += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    return total


class _CountMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records (FLOPs, bytes) of every aten op dispatched while active."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[OpCount] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _QUERIES:
            return func(*args, **kwargs)
        packet = func._overloadpacket
        if packet not in flop_registry:
            # As FlopCounterMode: composite ops count as what they decompose into.
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        out = func(*args, **kwargs)
        formula = flop_registry.get(packet)
        flops = float(formula(*args, **kwargs, out_val=out)) if formula is not None else 0.0
        moved = 0.0 if func.is_view or packet in _ALIASES else _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        kind, dims = _gemm_shape(packet, args)
        self.ops.append(OpCount(flops, moved, kind, dims))
        return out


@contextlib.contextmanager
def count_ops() -> Iterator[Callable[[], tuple[OpCount, ...]]]:
    """Count the aten ops dispatched within: ``with count_ops() as ops: ...; ops()`` is their counts."""
    mode = _CountMode()
    with mode:
        yield lambda: tuple(mode.ops)


_LINEAR = {aten.mm: 0, aten.addmm: 1}  # packet -> index of the first matrix operand
_BATCHED = {aten.bmm: 0, aten.baddbmm: 1}


def _gemm_shape(packet: Any, args: Any) -> tuple[str, tuple[float, ...]]:
    """(kind, (M, K, N)) of a matmul op; ("", ()) for any other op."""
    table, kind = (_LINEAR, "linear") if packet in _LINEAR else (_BATCHED, "bmm")
    if packet not in table:
        return "", ()
    i = table[packet]
    a, b = args[i], args[i + 1]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() < 2 or b.dim() < 2:
        return kind, ()
    return kind, (float(a.shape[-2]), float(a.shape[-1]), float(b.shape[-1]))


class _FusedAttention(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.nn.functional.scaled_dot_product_attention, aten.scaled_dot_product_attention.default):
            fused = _fused_sdpa(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


def _fused_sdpa(
    q: Any,
    k: Any,
    v: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    if not all(isinstance(t, torch.Tensor) and t.is_meta and t.dim() == 4 for t in (q, k, v)) or enable_gqa:
        return None
    if attn_mask is not None and is_causal:
        return None
    return _CPU_FLASH(q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


@contextlib.contextmanager
def fused_attention() -> Iterator[None]:
    """Within this context, attention on meta tensors takes the fused (flash) kernel's path."""
    with _FusedAttention():
        yield


def count_block(
    module: nn.Module, args: Sequence[Any], exclude: set[int] | frozenset[int] = frozenset()
) -> tuple[BlockCount, tuple[Any, ...]]:
    """Count ``module(*args)`` forward and backward on meta tensors; also return its outputs.

    ``args`` are meta tensors (floating ones become fresh autograd leaves, as in the measured
    profiler); ``exclude`` holds the storage keys of parameters (``profile.storage_key``).
    """
    leaves = [leaf(a) for a in args]

    def forward() -> Any:
        with fused_attention():
            return module(*leaves)

    with fused_attention():
        nbytes = saved_bytes(forward, exclude=set(exclude))
    fwd = _CountMode()
    with fwd:
        outs = tuple(forward())
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    grads = [torch.ones_like(o) for o in diff]
    inputs = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    bwd_in = _CountMode()
    if diff and inputs:
        with bwd_in:
            torch.autograd.grad(diff, inputs, grads, retain_graph=True, allow_unused=True)
    bwd = _CountMode()
    if diff:
        with bwd:
            torch.autograd.backward(diff, grads)
    for p in module.parameters():
        p.grad = None
    detached = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outs)
    return BlockCount(tuple(fwd.ops), tuple(bwd.ops), tuple(bwd_in.ops), nbytes), detached


def count_loss(
    loss: Callable[[list[Any]], torch.Tensor], outputs: Sequence[Any], exclude: set[int] | frozenset[int] = frozenset()
) -> BlockCount:
    """Count the training loss on the model's flat outputs (meta tensors, made leaves), as
    :func:`count_block` counts a block: its backward has no weights, so B = full backward."""
    leaves = [leaf(o) for o in outputs]
    nbytes = saved_bytes(lambda: loss(leaves), exclude=set(exclude))
    fwd = _CountMode()
    with fwd:
        value = loss(leaves)
    bwd = _CountMode()
    if value.requires_grad:
        with bwd:
            torch.autograd.backward([value])
    return BlockCount(tuple(fwd.ops), tuple(bwd.ops), tuple(bwd.ops), nbytes)


def leaf(v: Any) -> Any:
    """``v`` as a fresh autograd leaf (a floating tensor), so a block's backward stops at it."""
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.detach().requires_grad_(True)
    return v


def total(ops: Sequence[OpCount], cost: Callable[[OpCount], float]) -> float:
    """Sum of ``cost(op)`` over ``ops``."""
    return sum(cost(op) for op in ops)


# --------------------------------------------------------------------------- time


def op_time(op: OpCount, spec: DeviceSpec, peak: float, dtype: str = "") -> float:
    """Roofline time of one op on ``spec`` (``peak``: FLOP/s of the op's compute dtype ``dtype``,
    whose efficiency curve prices a GEMM by its size)."""
    compute = op.flops / (peak * spec.efficiency(dtype, op.size)) if op.flops else 0.0
    memory = op.bytes / (spec.memory_bandwidth * spec.memory_efficiency)
    return max(compute, memory) + spec.op_overhead_s


def op_dtype(op: OpCount, compute: str, linear: str = "") -> str:
    """The compute dtype that prices ``op``: ``linear`` for a linear layer's GEMM, if given."""
    return linear if linear and op.kind == "linear" else compute


def block_time(ops: Sequence[OpCount], spec: DeviceSpec, compute: str, linear: str = "") -> float:
    """Seconds for ``ops`` run one after another on ``spec``; ``linear``: the compute dtype of
    the linear layers' GEMMs where it is not ``compute`` (fp8 training)."""
    peaks = {d: spec.peak(d) for d in {compute, linear or compute}}
    total = 0.0
    for op in ops:
        dtype = op_dtype(op, compute, linear)
        total += op_time(op, spec, peaks[dtype], dtype)
    return total
