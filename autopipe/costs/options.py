"""Tensor, context and expert parallelism for the cluster search: which degrees a model and a
cluster allow, and one device's profile at each.

:func:`parallel_options` reads a counted model's structure once -- its transformer layers
(``costs.tensor``), its attention (``costs.context``), its routed experts (``costs.experts``)
-- and returns :class:`ParallelOptions`, whose ``price(Layout)`` is one device's Profile at
the degrees ``t x cp x ep (x etp)`` (cached per layout), as ``TensorOptions.price(t)`` is for
tensor parallelism alone. Placement follows Megatron-Core's rank order (tensor innermost, then
context, then data; pipeline outermost; the experts' ``etp x ep`` folded into the same ranks):
a context-parallel group of ``t cp`` ranks stays on NVLink when it fits a node, else its ring
crosses the network; an EP group of ``ep etp`` ranks has ``min(ep, n / etp)`` ranks in each
node of ``n`` devices. :func:`layout_reason` says why a layout cannot be used (Megatron-Core's
rules), :func:`expert_gradient_group` over how many devices a routed expert's gradients are
reduced.

How the tensor x context x pipeline x data x expert search takes these (for
``planner/parallel.py``): for each ``t`` (``tensor.tensor_degrees``), ``cp`` (divisors of
``G / t`` with :func:`layout_reason` empty), pipeline depth ``S`` and ``d = G / (t cp S)``, and
each ``ep`` (``experts.expert_degrees(shape, t cp d, etp)``), price ``options.price(Layout(t, cp,
ep, etp))`` and plan the pipeline on ``global_batch / d`` samples; per stage, reduce the dense
gradients (``param_bytes - expert_params * bytes``) over ``d cp`` devices and the routed
experts' (``BlockCost.expert_params``) over :func:`expert_gradient_group`; a distributed
optimizer shards each part's state over its own group. Where the target overlaps the expert
all-to-all (DualPipeV's paired forward and backward; Megatron's
``--overlap-moe-expert-parallel-comm``), ``options.alltoall(layout, u)`` is what may be hidden
behind the other micro-batch's compute: one MoE layer's forward (dispatch, combine) all-to-alls
at micro-batch size ``u`` (each backward one takes the combine's time; ``experts.alltoall_parts``),
already inside the profile's block times; a block whose ``expert_params`` is not 0 holds one
MoE layer (blocks follow the layers).

Tests: tests/costs/test_experts.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autopipe.costs.context import ContextShape, ContextSplit, context_reason, context_shape
from autopipe.costs.degrees import Degrees
from autopipe.costs.experts import DEFAULT_IMBALANCE, ExpertSplit, MoEShape, alltoall_parts, expert_reason, moe_shape
from autopipe.costs.tensor import TensorSplit, TransformerShape, shape_of, tensor_reason

if TYPE_CHECKING:
    from autopipe.costs.analytic import ModelCounts
    from autopipe.costs.devices import DeviceSpec
    from autopipe.costs.profile import Profile

__all__ = ["Layout", "Links", "ParallelOptions", "expert_gradient_group", "layout_reason", "parallel_options"]


@dataclass(frozen=True)
class Layout:
    """One device's degrees: tensor ``t``, context ``cp``, expert ``ep`` and expert tensor ``etp``."""

    t: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1


@dataclass(frozen=True)
class Links:
    """A cluster's links (bytes/s per device, one direction), as ``planner.placement.Cluster``."""

    devices_per_node: int
    nvlink_bandwidth: float
    network_bandwidth: float
    link_latency_s: float = 10e-6
    network_latency_s: float = 10e-6

    @staticmethod
    def of(cluster: Any) -> Links:
        """From a ``Cluster`` (or a ``DeviceSpec``): its node size, bandwidths and latencies."""
        net: float = getattr(cluster, "net_latency_s", None) or cluster.link_latency_s
        return Links(
            cluster.devices_per_node,
            cluster.nvlink_bandwidth,
            cluster.network_bandwidth,
            cluster.link_latency_s,
            net,
        )


@dataclass(frozen=True)
class ParallelOptions:
    """A model's parallel structure and its one-device profile per :class:`Layout`."""

    tensor: TransformerShape | None  # None: t = 1 only
    context: ContextShape | None  # None: cp = 1 only
    experts: MoEShape | None  # None: no routed experts (ep = 1)
    links: Links
    price: Callable[[Layout], Profile]
    alltoall: Callable[[Layout, float], tuple[float, float]]  # (layout, u) -> one MoE layer's (dispatch, combine) s
    sequence_parallel: bool = True
    imbalance: float = DEFAULT_IMBALANCE
    # Of the device's SMs, those the all-to-all kernels hold while they run beside compute (0: not
    # known; Megatron-Core's DeepEP dispatcher: 20, ``moe_flex_dispatcher_num_sms``' default)
    alltoall_share: float = 0.0


def layout_reason(options: ParallelOptions, layout: Layout, devices: int, stages: int = 1) -> str:
    """Why ``layout`` cannot run on ``devices`` devices in ``stages`` pipeline stages ('' when it
    can): t within a node and dividing the heads, the sequence into 2 cp chunks, t cp S dividing
    the devices, E divisible by ep and the stage's ``t cp d`` devices by ``ep etp``."""
    t, cp = layout.t, layout.cp
    why = tensor_reason(options.tensor, t, options.links.devices_per_node, devices)
    if why:
        return why
    why = context_reason(options.context, cp)
    if why:
        return why
    if devices % (t * cp * stages):
        return f"t={t} x cp={cp} x {stages} stages does not divide {devices} devices"
    return expert_reason(options.experts, layout.ep, layout.etp, devices // stages)


def expert_gradient_group(layout: Layout, data_parallel: int) -> int:
    """Devices that reduce a routed expert's gradients: the stage's ``t cp d`` over ``ep etp``."""
    return max(1, layout.t * layout.cp * data_parallel // (layout.ep * layout.etp))


def _degrees(options: ParallelOptions, layout: Layout, extras: dict[str, Any]) -> Degrees:
    links, t, cp = options.links, layout.t, layout.cp
    n = links.devices_per_node
    tensor = (
        TensorSplit(
            options.tensor,
            t,
            options.sequence_parallel,
            links.nvlink_bandwidth,
            links.link_latency_s,
            extras.get("tensor_overlap", 0.0),
        )
        if options.tensor is not None and t > 1
        else None
    )
    context = None
    if options.context is not None and cp > 1:
        inside = t * cp <= n
        context = ContextSplit(
            options.context,
            cp,
            links.nvlink_bandwidth if inside else links.network_bandwidth,
            links.link_latency_s if inside else links.network_latency_s,
            extras.get("balanced", True),
        )
    experts = None
    if options.experts is not None:
        experts = ExpertSplit(
            options.experts,
            layout.ep,
            links.nvlink_bandwidth,
            links.network_bandwidth,
            ranks_per_node=max(1, min(layout.ep, n // layout.etp)),
            tensor=layout.etp,
            imbalance=options.imbalance,
            link_latency_s=links.link_latency_s,
            network_latency_s=links.network_latency_s,
            dispatch_bytes=extras.get("dispatch_bytes", 0.0),
            deduplicate=extras.get("deduplicate", False),
            max_nodes=extras.get("max_nodes", 0),
        )
    return Degrees(tensor, context, experts)


def parallel_options(
    counts: ModelCounts,
    spec: DeviceSpec,
    links: Links | None = None,
    *,
    sequence_parallel: bool = True,
    imbalance: float = DEFAULT_IMBALANCE,
    balanced: bool = True,
    dispatch_bytes: float = 0.0,
    deduplicate: bool = False,
    max_nodes: int = 0,
    tensor_overlap: float = 0.0,
    fused: bool = False,
    alltoall_share: float = 0.0,
) -> ParallelOptions:
    """The parallel structure of ``counts`` and its pricing on ``spec`` over ``links`` (the
    device's own when None); ``imbalance``, ``balanced`` (CP's 2 cp chunks), ``dispatch_bytes``,
    ``deduplicate`` and ``max_nodes`` as ``ExpertSplit`` and ``ContextSplit`` take them,
    ``tensor_overlap`` as ``TensorSplit.overlap`` (``Overlap.tp_comm``); ``fused``: memory-bound
    ops fused as the target framework runs them (``Target.fused_kernels``, ``costs.fusion``);
    ``alltoall_share``: of the device's SMs, the all-to-all kernels' (``ParallelOptions``)."""
    from autopipe.costs.analytic import profile_from_counts

    if not (imbalance >= 1.0 and imbalance < float("inf")):
        raise ValueError(f"imbalance must be a number >= 1 (got {imbalance!r}); 1.0 is a perfectly even routing")
    if not 0.0 <= alltoall_share < 1.0:
        raise ValueError(f"alltoall_share must be in [0, 1) (got {alltoall_share!r}); 0 where not known")
    traced, model = counts.traces[0], counts.loaded.model
    tensor = shape_of(traced, model)
    seq = tensor.seq if tensor is not None else 0
    hidden = tensor.hidden if tensor is not None else 0
    experts = moe_shape(traced, model, hidden, seq) if tensor is not None else None
    context = context_shape(model, seq) if tensor is not None else None
    extras = {
        "balanced": balanced,
        "dispatch_bytes": dispatch_bytes,
        "deduplicate": deduplicate,
        "max_nodes": max_nodes,
        "tensor_overlap": tensor_overlap,
    }
    chosen = links or Links.of(spec)
    cache: dict[Layout, Profile] = {}
    elt = float(counts.precision.dtype.itemsize)

    def options() -> ParallelOptions:
        return ParallelOptions(
            tensor, context, experts, chosen, price, alltoall, sequence_parallel, imbalance, alltoall_share
        )

    def price(layout: Layout) -> Profile:
        if layout not in cache:
            d = _degrees(options(), layout, extras)
            cache[layout] = profile_from_counts(counts, spec, d if d != Degrees() else None, fused)
        return cache[layout]

    def alltoall(layout: Layout, u: float) -> tuple[float, float]:
        d = _degrees(options(), layout, extras)
        if d.experts is None or experts is None:
            return 0.0, 0.0
        return alltoall_parts(d.experts, u * experts.seq / (layout.t * layout.cp), elt)

    return options()
