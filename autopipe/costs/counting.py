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
formula (Dao et al. 2022, FlashAttention) includes: 2.5x the forward, not 2x. Values of
another head size than the queries' (multi-head latent attention: 192 vs 128) take the
memory-efficient kernel's op, whose meta kernel gives the output that size.

Mixtures of experts: grouped GEMMs (``aten._grouped_mm``, and the fallback op Hugging Face's
MoE layers use where it cannot run) count ``2 M K N`` over the rows they are given -- the
(token, expert) pairs the router chose, so the top-k experts' work, not every expert's --
where torch's registry has no formula for them (their FLOPs were 0). Ops on a block's
routed-expert weights are marked ``expert`` (:class:`OpCount`) when ``count_block`` is told
which parameter storages those are: a forward op that reads one (or a tensor made from them
alone: a transpose, an index, a cast), a backward op run by an autograd node whose input
chain leads to one (the expert GEMMs' input and weight gradients), so ``costs.experts``
can price them under expert parallelism.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from autopipe.costs.activations.fp8 import cast_ops, saved_bytes_fp8_linears
from autopipe.costs.devices import DeviceSpec
from autopipe.costs.measure.timing import saved_bytes, storage_key
from autopipe.costs.sdpa import _CPU_FLASH, fused_attention

__all__ = [
    "BlockCount",
    "OpCount",
    "block_time",
    "count_block",
    "count_loss",
    "count_ops",
    "fused_attention",
    "keys_of",
    "leaf",
    "numbered",
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
    # "linear", "bmm", "grouped" (GEMMs), "attention" (fused attention), "heads" (costs.fusion), "eager" (a
    # memory-bound op run as its own kernel even by a fusing framework: count_loss) or ""
    kind: str = ""
    dims: tuple[float, ...] = ()  # a GEMM's (M, K, N) (grouped: per group, on average); () for any other op
    expert: bool = False  # reads or computes the gradient of a routed expert's weights
    # What it reads and writes, as (storage key, bytes) per storage (``costs.fusion`` prices a run of
    # memory-bound ops as one kernel from them); () for views and ops made by pricing, not counting.
    reads: tuple[tuple[int, float], ...] = ()
    writes: tuple[tuple[int, float], ...] = ()
    # The share of ``flops`` the kernel runs: 0.5 for causal fused attention over a square score matrix,
    # whose masked half FlashAttention skips (Dao 2023, FlashAttention-2, sec. 3.1.1: "around 1.7-1.8x
    # speedup" from skipping it); ``flops`` stays the full count, the convention model FLOPs are quoted in.
    work: float = 1.0

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
    # Storage keys (``OpCount.reads``) of what leaves the block: its outputs, and the gradients its
    # backward hands back (inputs' and parameters'); a fused kernel must write these (``costs.fusion``).
    escapes: frozenset[int] = frozenset()
    grads: frozenset[int] = frozenset()  # of those, the parameters' gradients

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
_CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward
if _CPU_FLASH not in flop_registry:
    register_flop_formula(_CPU_FLASH)(_cpu_flash_flops)
if _CPU_FLASH_BACKWARD not in flop_registry:
    register_flop_formula(_CPU_FLASH_BACKWARD)(_cpu_flash_backward_flops)


def grouped_mm_flops(a_shape: Sequence[int], b_shape: Sequence[int]) -> int:
    """FLOPs of a grouped GEMM of operands shaped ``a_shape`` and ``b_shape`` (``offs`` splits one
    dimension into groups): (S, K) x (G, K, N) is 2 S K N (each of S rows times its group's
    matrix), (M, S) x (S, N) into (G, M, N) is 2 M S N (a weight gradient: S split), (G, M, K)
    x (K, S) into (M, S) is 2 M K S (S split), (G, M, K) x (G, K, N) is 2 G M K N."""
    if len(a_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[-1]
    if len(b_shape) == 2:
        return 2 * a_shape[1] * a_shape[2] * b_shape[1]
    return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[-1]


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(getattr(t, "shape", t))  # torch's registry hands formulas shapes, not tensors


def _grouped_flops(a: Any, b: Any, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return grouped_mm_flops(_shape(a), _shape(b))


def _fallback_backward_flops(a: Any, b: Any, offs: Any, grad: Any, *args: Any, **kwargs: Any) -> int:
    return 2 * grouped_mm_flops(_shape(a), _shape(b))  # the input and the weight gradients


_GROUPED = aten._grouped_mm
if _GROUPED not in flop_registry:
    register_flop_formula(_GROUPED)(_grouped_flops)
# Hugging Face's grouped-GEMM fallback (transformers.integrations.moe), registered by name: the
# op exists only once transformers has loaded it.
_NAMED_FLOPS: dict[str, Callable[..., int]] = {
    "transformers::grouped_mm_fallback": _grouped_flops,
    "transformers::grouped_mm_fallback_backward": _fallback_backward_flops,
}

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


def _storages(tree: Any) -> tuple[tuple[int, float], ...]:
    """(storage key, bytes) of each storage the tensors in ``tree`` lie in, once each (the bytes of
    its largest tensor there, at most the storage's size, as :func:`_tensor_bytes`), in the order
    the tensors come: never sorted by key, an address that differs from run to run (:func:`numbered`)."""
    found: dict[int, float] = {}
    for t in torch.utils._pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor):
            key = storage_key(t)
            found[key] = max(
                found.get(key, 0.0), float(min(t.numel() * t.element_size(), t.untyped_storage().nbytes()))
            )
    return tuple(found.items())


def _tensor_bytes(tree: Any) -> float:
    total = 0.0
    for t in torch.utils._pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor):
            total += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    return total


class _CountMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records (FLOPs, bytes) of every aten op dispatched while active; ``experts``: storage
    keys of routed-expert weights (forward ops reading them are marked), ``nodes``: the ids of
    the autograd nodes whose backward ops are marked (see the module docstring)."""

    def __init__(self, experts: frozenset[int] = frozenset(), nodes: Mapping[int, Any] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[OpCount] = []
        self.experts = set(experts)  # grows by the tensors made from expert weights alone
        self.nodes = nodes or {}
        self.keep: list[torch.Tensor] = []  # those tensors, alive so no storage key is reused
        self.alive: list[Any] = []  # every op's outputs, alive so no two storages share a key while counting

    def _expert(self, args: Any, kwargs: Any, out: Any) -> bool:
        if self.nodes:
            node = torch._C._current_autograd_node()
            if node is not None:
                return id(node) in self.nodes
        if not self.experts:
            return False
        floats = [
            t
            for t in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        ]
        keys = [storage_key(t) for t in floats]
        if floats and all(k in self.experts for k in keys):  # W.t(), W[idx], W.to(bf16): still the weights
            made = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            self.experts.update(storage_key(t) for t in made)
            self.keep.extend(made)
        return any(k in self.experts for k in keys)

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
        formula = flop_registry.get(packet) or _NAMED_FLOPS.get(str(func._schema.name))
        flops = float(formula(*args, **kwargs, out_val=out)) if formula is not None else 0.0
        aliasing = func.is_view or packet in _ALIASES
        moved = 0.0 if aliasing else _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        kind, dims = _gemm_shape(packet, args)
        if not kind and str(func._schema.name) in _NAMED_FLOPS:
            kind, dims = "grouped", _grouped_dims(args)
        reads, writes = ((), ()) if aliasing else (_storages((args, kwargs)), _storages(out))
        self.alive.append(out)
        work = 0.5 if kind == "attention" and _causal_square(func, args, kwargs) else 1.0
        self.ops.append(OpCount(flops, moved, kind, dims, self._expert(args, kwargs, out), reads, writes, work))
        return out


@contextlib.contextmanager
def count_ops() -> Iterator[Callable[[], tuple[OpCount, ...]]]:
    """Count the aten ops dispatched within: ``with count_ops() as ops: ...; ops()`` is their counts."""
    mode = _CountMode()
    with mode:
        yield lambda: tuple(mode.ops)


_LINEAR = {aten.mm: 0, aten.addmm: 1}  # packet -> index of the first matrix operand
_BATCHED = {aten.bmm: 0, aten.baddbmm: 1}


def _grouped_dims(args: Any) -> tuple[float, ...]:
    """A grouped GEMM's (M, K, N) per group, on average (groups: the leading dim of its 3-D
    operand, or of its output for the weight gradient)."""
    a, b = args[0], args[1]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return ()
    if a.dim() == 2 and b.dim() == 3:  # (S, K) x (G, K, N)
        return (a.shape[0] / max(1, b.shape[0]), float(a.shape[1]), float(b.shape[2]))
    if a.dim() == 3 and b.dim() == 2:  # (G, M, K) x (K, S): S split
        return (float(a.shape[1]), float(a.shape[2]), b.shape[1] / max(1, a.shape[0]))
    if a.dim() == 3:
        return (float(a.shape[1]), float(a.shape[2]), float(b.shape[-1]))
    offs = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
    groups = max(1, offs.shape[0]) if offs is not None else 1
    return (float(a.shape[0]), a.shape[1] / groups, float(b.shape[1]))  # (M, S) x (S, N) per group


_ATTENTION = {
    getattr(aten, name)
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_cudnn_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_flash_attention_forward",
        "_flash_attention_backward",
        "_efficient_attention_forward",
        "_efficient_attention_backward",
    )
    if hasattr(aten, name)
}


def _causal_square(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether an attention op is causal over as many keys as queries (its ``is_causal`` argument)."""
    names = [a.name for a in func._schema.arguments]
    if "is_causal" not in names:
        return False
    i = names.index("is_causal")
    causal = kwargs.get("is_causal", args[i] if i < len(args) else False)
    q, k = args[names.index("query")], args[names.index("key")]
    return bool(causal) and isinstance(q, torch.Tensor) and q.shape[-2] == k.shape[-2]


def _gemm_shape(packet: Any, args: Any) -> tuple[str, tuple[float, ...]]:
    """(kind, (M, K, N)) of a matmul op; ("attention", ()) of fused attention; ("", ()) for any other op."""
    if packet in _ATTENTION:
        return "attention", ()
    if packet is _GROUPED:
        return "grouped", _grouped_dims(args)
    table, kind = (_LINEAR, "linear") if packet in _LINEAR else (_BATCHED, "bmm")
    if packet not in table:
        return "", ()
    i = table[packet]
    a, b = args[i], args[i + 1]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() < 2 or b.dim() < 2:
        return kind, ()
    return kind, (float(a.shape[-2]), float(a.shape[-1]), float(b.shape[-1]))


def count_block(
    module: nn.Module,
    args: Sequence[Any],
    exclude: set[int] | frozenset[int] = frozenset(),
    experts: frozenset[int] = frozenset(),
    flash: bool = True,
    fp8_linears: bool = False,
) -> tuple[BlockCount, tuple[Any, ...]]:
    """Count ``module(*args)`` forward and backward on meta tensors; also return its outputs.

    ``args`` are meta tensors (floating ones become fresh autograd leaves, as in the measured
    profiler); ``exclude`` holds the storage keys of parameters (``profile.storage_key``),
    ``experts`` those of routed-expert weights, whose ops are marked (module docstring);
    ``flash``: attention as the fused kernel (else unfused: :func:`fused_attention`);
    ``fp8_linears``: the linear layers' saved inputs in FP8, and their casts to FP8 counted
    (``activations.fp8``).
    """
    leaves = [leaf(a) for a in args]

    def forward() -> Any:
        with fused_attention(flash):
            return module(*leaves)

    counter = saved_bytes_fp8_linears if fp8_linears else saved_bytes
    with fused_attention(flash):
        nbytes = counter(forward, exclude=set(exclude))
    fwd = _CountMode(experts)
    with fwd:
        outs = tuple(forward())
    diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    grads = [torch.ones_like(o) for o in diff]
    inputs = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    nodes = _expert_nodes(diff, experts)
    bwd_in = _CountMode(nodes=nodes)
    handed: list[Any] = list(outs)  # what leaves the block: outputs, then the gradients handed back
    if diff and inputs:
        with bwd_in:
            handed += torch.autograd.grad(diff, inputs, grads, retain_graph=True, allow_unused=True)
    bwd = _CountMode(nodes=nodes)
    if diff:
        with bwd:
            torch.autograd.backward(diff, grads)
    weights = [p.grad for p in module.parameters() if p.grad is not None]
    handed += [*(t.grad for t in inputs), *weights]
    escapes = frozenset(storage_key(t) for t in handed if isinstance(t, torch.Tensor))
    weight_grads = frozenset(storage_key(t) for t in weights)
    for p in module.parameters():
        p.grad = None
    detached = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in outs)
    forward_ops, backward_ops, input_ops = tuple(fwd.ops), tuple(bwd.ops), tuple(bwd_in.ops)
    if fp8_linears:  # Transformer Engine's casts to FP8 (activations.fp8.cast_ops)
        cast_bytes, grad_cast_bytes = cast_ops(forward_ops)
        casts = tuple(OpCount(0.0, b, kind="eager") for b in cast_bytes)
        grad_casts = tuple(OpCount(0.0, b, kind="eager") for b in grad_cast_bytes)
        forward_ops, backward_ops, input_ops = casts + forward_ops, grad_casts + backward_ops, grad_casts + input_ops
    count = numbered(BlockCount(forward_ops, backward_ops, input_ops, nbytes, escapes, weight_grads))
    del handed, weights, fwd, bwd, bwd_in  # the storages stay alive up to here, so every key above is one storage's
    return count, detached


def _expert_nodes(outputs: Sequence[torch.Tensor], experts: frozenset[int]) -> dict[int, Any]:
    """The autograd nodes behind ``outputs`` (by id) whose backward computes an expert weight's
    gradient: an input of theirs leads, through nodes of one input each (views, casts, indexing
    of the weight), to the accumulation of a weight in ``experts``. The dict holds the nodes'
    Python objects, so each keeps its id (the one ``_current_autograd_node`` returns)."""
    if not experts:
        return {}
    leads: dict[int, bool] = {}
    alive: list[Any] = []  # every node looked at, so no id is reused while this runs

    def to_expert(fn: Any) -> bool:
        chain = []
        while fn is not None and id(fn) not in leads:
            chain.append(fn)
            variable = getattr(fn, "variable", None)
            if isinstance(variable, torch.Tensor):
                leads[id(fn)] = storage_key(variable) in experts
                break
            nexts = [f for f, _ in fn.next_functions if f is not None]
            if len(nexts) != 1:
                leads[id(fn)] = False
                break
            fn = nexts[0]
        answer = leads.get(id(fn), False) if fn is not None else False
        for f in chain:
            leads[id(f)] = answer
        alive.extend(chain)
        return answer

    marked: dict[int, Any] = {}
    seen: set[int] = set()
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        alive.append(fn)
        nexts = [f for f, _ in fn.next_functions if f is not None]
        if any(to_expert(f) for f in nexts):
            marked[id(fn)] = fn
        stack.extend(nexts)
    return marked


def count_loss(
    loss: Callable[[list[Any]], torch.Tensor],
    outputs: Sequence[Any],
    exclude: set[int] | frozenset[int] = frozenset(),
    eager: bool = False,
) -> BlockCount:
    """Count the training loss on the model's flat outputs (meta tensors, made leaves), as
    :func:`count_block` counts a block: its backward has no weights, so B = full backward.
    ``eager``: its memory-bound ops marked ``kind`` ``"eager"``, each its own kernel where a fusing
    framework would merge them (``costs.fusion``; Megatron-LM's unfused cross entropy, ``costs.losses``)."""
    leaves = [leaf(o) for o in outputs]
    nbytes = saved_bytes(lambda: loss(leaves), exclude=set(exclude))
    fwd = _CountMode()
    with fwd:
        value = loss(leaves)
    bwd = _CountMode()
    if value.requires_grad:
        with bwd:
            torch.autograd.backward([value])
    handed = [value, *(t.grad for t in leaves if isinstance(t, torch.Tensor))]
    escapes = frozenset(storage_key(t) for t in handed if isinstance(t, torch.Tensor))
    forward, backward = tuple(fwd.ops), tuple(bwd.ops)
    if eager:
        forward, backward = _eager(forward), _eager(backward)
    return numbered(BlockCount(forward, backward, backward, nbytes, escapes))


def _eager(ops: Sequence[OpCount]) -> tuple[OpCount, ...]:
    """``ops`` with the memory-bound ones (no FLOPs, no kernel kind) marked ``"eager"``."""
    return tuple(replace(op, kind="eager") if op.flops == 0 and not op.kind else op for op in ops)


def numbered(count: BlockCount, start: int = 0) -> BlockCount:
    """``count`` with its storage keys renamed ``start``, ``start + 1``, ... in the order they first
    appear (forward, input-gradient, full backward ops, then what escapes): a storage's address is
    the allocator's choice and may differ from one run to the next, its number here does not, so
    identical blocks count identically and two counts joined (a block and its loss) share no key."""
    names: dict[int, int] = {}

    def name(key: int) -> int:
        return names.setdefault(key, start + len(names))

    def ops(seq: Sequence[OpCount]) -> tuple[OpCount, ...]:
        return tuple(
            replace(
                op,
                reads=tuple((name(k), b) for k, b in op.reads),
                writes=tuple((name(k), b) for k, b in op.writes),
            )
            if op.reads or op.writes
            else op
            for op in seq
        )

    fwd, bwd_in, bwd = ops(count.forward), ops(count.backward_input), ops(count.backward)
    escapes = frozenset(name(k) for k in sorted(count.escapes, key=lambda k: names.get(k, len(names) + k)))
    return BlockCount(fwd, bwd, bwd_in, count.saved_bytes, escapes, frozenset(name(k) for k in count.grads))


def keys_of(count: BlockCount) -> int:
    """One past the largest storage number in ``count`` (:func:`numbered`); 0 for none."""
    found = [
        k
        for seq in (count.forward, count.backward, count.backward_input)
        for op in seq
        for k, _ in op.reads + op.writes
    ]
    return max([*found, *count.escapes], default=-1) + 1


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
    compute = op.flops * op.work / (peak * spec.efficiency(dtype, op.size)) if op.flops else 0.0
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
