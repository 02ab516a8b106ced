"""Memory choices between keeping every activation and recomputing whole stages, as profiles.

Megatron-LM's ways to keep fewer activations than all of them (Korthikanti et al. 2022;
Megatron-Core's fine-grained activation offloading; PipeOffload, Wan et al. 2025), each uniform
over the model's layers, the forms Megatron-LM can express:

- **selective recomputation** of module kinds (``--recompute-granularity selective
  --recompute-modules core_attn mlp layernorm``): each layer keeps what
  :meth:`~autopipe.costs.activations.anatomy.Anatomy.held` says and runs the kinds' forward again in its
  backward;
- **activation offload** of module kinds (``--fine-grained-activation-offloading
  --offload-modules ...``): each layer keeps its saved bytes less what goes to the host, and the
  copy to the host (forward) and back (backward) runs on the host link beside the compute;
- **recomputing the first k layers of each stage** whole (``--recompute-granularity full
  --recompute-method block --recompute-num-layers k``): depends on the cuts, so it is the
  partition problem's (``partition/layers.py``), not a profile's.

A layer's options (:class:`~autopipe.costs.profile.MemoryOption`) are counted from its own ops
(:func:`layer_options`); the planner searches each choice (:class:`MemoryChoice`) as a profile
(:func:`apply`): every layer's held bytes and backward time under it, searched as the profile
itself is. Which selective choices are worth searching is :func:`choices`: the ones no other
choice beats in both the bytes it keeps and the time it adds (summed over the layers).

The offload's time (an assumption, stated): the copy engine moves a layer's offloaded bytes
while the layer computes, so its forward takes ``max(F, x / host_bandwidth)`` and its backward
``max(B, x / host_bandwidth)`` (the prefetch of the next layer back overlapping this one);
a stage also holds one micro-batch's offloaded bytes at once (the one being copied), as a
staging buffer (``BlockCost.staging_bytes``).

Tests: tests/costs/activations/test_choices.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from autopipe.costs.profile import Affine, BlockCost, MemoryOption, Profile
from autopipe.errors import PlanError
from autopipe.graph.kinds import OFFLOAD_KINDS, RECOMPUTE_KINDS

__all__ = [
    "NO_CHOICE",
    "RECOMPUTE_SETS",
    "MemoryChoice",
    "apply",
    "choices",
    "layer_options",
]

RECOMPUTE_SETS: tuple[tuple[str, ...], ...] = tuple(
    kinds
    for r in range(1, len(RECOMPUTE_KINDS) + 1)
    for kinds in itertools.combinations(sorted(RECOMPUTE_KINDS), r)
    if not {"mlp", "mlp_act"} <= set(kinds)  # the MLP whole holds its activation already
)
"""Every set of module kinds that may be recomputed together (23: the five kinds, mlp and
mlp_act not both)."""


@dataclass(frozen=True)
class MemoryChoice:
    """One uniform way to keep fewer activations: the plan's ``recompute_modules``,
    ``recompute_layers`` or ``offload_modules`` (at most one of them; none of them: every
    activation kept, or stages recomputed whole)."""

    recompute: tuple[str, ...] = ()  # module kinds recomputed in every layer
    offload: tuple[str, ...] = ()  # module kinds whose saved inputs go to the host in every layer
    layers: int = 0  # the first k layers of each stage recomputed whole (the block method)

    def __post_init__(self) -> None:
        if sum(map(bool, (self.recompute, self.offload, self.layers))) > 1:
            raise PlanError("recompute modules, offload modules and recomputed layers are one choice; give one of them")
        for what, kinds, known in (
            ("recompute", self.recompute, RECOMPUTE_KINDS),
            ("offload", self.offload, OFFLOAD_KINDS),
        ):
            if not isinstance(kinds, tuple) or any(k not in known for k in kinds) or len(set(kinds)) != len(kinds):
                raise PlanError(f"{what} modules {list(kinds)!r}: name each once, among {', '.join(known)}")
            object.__setattr__(self, what, tuple(sorted(kinds)))
        if {"mlp", "mlp_act"} <= set(self.recompute):
            raise PlanError(
                "recompute modules mlp and mlp_act: mlp recomputes the whole MLP, its activation included; give one"
            )
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 0:
            raise PlanError(f"recomputed layers must be a whole number >= 0, not {self.layers!r}")

    @property
    def none(self) -> bool:
        return not (self.recompute or self.offload or self.layers)

    @property
    def key(self) -> tuple[object, ...]:
        """The order among choices that tie: none first, then offload, selective, the block method."""
        kind = 0 if self.none else 1 if self.offload else 2 if self.recompute else 3
        return (kind, self.layers, len(self.offload), self.offload, len(self.recompute), self.recompute)

    @property
    def said(self) -> str:
        """``recompute core_attn+mlp``, ``offload qkv_linear``, ``recompute 2 layers per stage`` or ``none``."""
        if self.recompute:
            return "recompute " + "+".join(self.recompute)
        if self.offload:
            return "offload " + "+".join(self.offload)
        if self.layers:
            return f"recompute {self.layers} layer{'s' if self.layers != 1 else ''} per stage"
        return "none"


NO_CHOICE = MemoryChoice()

NEGLIGIBLE = 0.01
"""A recompute set that keeps less than this share of the layers' saved bytes below a faster
one is not searched (recomputing fused attention frees its log-sum-exp alone: 0.4% of a GPT-3
layer's bytes, for the attention's whole forward again)."""


def layer_options(
    held: Callable[[tuple[str, ...], float], float],
    recomputed: Callable[[tuple[str, ...], float], tuple[float, float]],
    offloaded: Callable[[tuple[str, ...], float], float],
    has: Callable[[tuple[str, ...], bool], bool],
    sizes: Sequence[float],
) -> tuple[MemoryOption, ...]:
    """A layer's options at the micro-batch sizes ``sizes`` (fitted as every cost is): every
    recompute set it has regions for (``has(kinds, False)``; ``held(kinds, u)`` bytes kept,
    ``recomputed(kinds, u)`` its (seconds, FLOPs)) that keeps less than all, and every single
    offload kind it has (``has((kind,), True)``; ``offloaded(kinds, u)`` bytes moved, maybe none)."""
    xs = list(sizes)

    def fit(f: Callable[[float], float]) -> Affine:
        return Affine.fit(xs, [f(u) for u in xs])

    everything = fit(lambda u: held((), u))
    out: list[MemoryOption] = []
    for kinds in RECOMPUTE_SETS:
        if has(kinds, False):
            kept = fit(lambda u, k=kinds: held(k, u))  # type: ignore[misc]
            if kept(xs[-1]) < everything(xs[-1]):
                out.append(
                    MemoryOption(
                        recompute=kinds,
                        saved_bytes=kept,
                        recompute_s=fit(lambda u, k=kinds: recomputed(k, u)[0]),  # type: ignore[misc]
                        recompute_flops=fit(lambda u, k=kinds: recomputed(k, u)[1]),  # type: ignore[misc]
                    )
                )
    for kind in OFFLOAD_KINDS:  # every kind the layer has, even one whose inputs another kind saves too
        moved = fit(lambda u, k=kind: offloaded((k,), u))  # type: ignore[misc]
        if has((kind,), True):
            out.append(
                MemoryOption(
                    offload=(kind,),
                    saved_bytes=Affine(
                        max(0.0, everything.intercept - moved.intercept), max(0.0, everything.slope - moved.slope)
                    ),
                    offload_bytes=moved,
                )
            )
    return tuple(out)


def _option(block: BlockCost, choice: MemoryChoice) -> MemoryOption | None:
    """``block``'s option for a selective recompute or an offload choice (None: it has none)."""
    if choice.recompute:
        return next((o for o in block.memory if o.recompute == choice.recompute), None)
    moved = [o for o in block.memory if o.offload and o.offload[0] in choice.offload]
    if not moved:
        return None
    total = Affine(sum(o.offload_bytes.intercept for o in moved), sum(o.offload_bytes.slope for o in moved))
    saved = block.saved_bytes
    return MemoryOption(
        offload=choice.offload,
        saved_bytes=Affine(max(0.0, saved.intercept - total.intercept), max(0.0, saved.slope - total.slope)),
        offload_bytes=total,
    )


def apply(profile: Profile, choice: MemoryChoice, host_bandwidth: float = 0.0) -> Profile:
    """``profile`` with every layer priced under ``choice`` (a selective recompute or an offload;
    the block method and none leave it as it is): held bytes, backward time (the recomputed
    forward, or the copy back where it is slower), forward time (the copy out where it is
    slower) and, for an offload, the staging buffer. Times that take a max are priced at the
    profile's micro-batch sizes and fitted, as the profile's own costs are."""
    if not (choice.recompute or choice.offload):
        return profile
    if choice.offload and not host_bandwidth > 0:
        raise PlanError(
            "activation offload needs the device's host link bandwidth (host_bandwidth in the device catalogue)"
        )
    xs = [float(u) for u in profile.micro_batch_sizes]
    blocks = []
    for b in profile.blocks:
        option = _option(b, choice)
        if option is None:
            blocks.append(b)
            continue
        if choice.recompute:
            blocks.append(
                replace(
                    b,
                    saved_bytes=option.saved_bytes,
                    backward_s=_plus(b.backward_s, option.recompute_s),
                    backward_input_s=_plus(b.backward_input_s, option.recompute_s),
                )
            )
            continue
        copy = Affine(option.offload_bytes.intercept / host_bandwidth, option.offload_bytes.slope / host_bandwidth)

        def slower(cost: Affine, copy: Affine = copy) -> Affine:
            return Affine.fit(xs, [max(cost(u), copy(u)) for u in xs]) if xs else cost

        blocks.append(
            replace(
                b,
                saved_bytes=option.saved_bytes,
                forward_s=slower(b.forward_s),
                backward_s=slower(b.backward_s),
                backward_input_s=slower(b.backward_input_s),
                staging_bytes=option.offload_bytes,
            )
        )
    return replace(profile, blocks=tuple(blocks))


def _plus(a: Affine, b: Affine) -> Affine:
    return a.plus(b)  # an all-to-all hidden (planner.cluster.experts) stays hidden


def choices(profile: Profile, u: float, host_bandwidth: float = 0.0) -> tuple[MemoryChoice, ...]:
    """The selective recomputation and offload choices worth searching for ``profile`` at
    micro-batch size ``u``, fastest first: every recompute set all layers have, and (where the
    device has a host link) an offload ladder, the kinds that move the most first, one more at a
    time; of these, each that no other beats in both the bytes the layers keep (up to
    :data:`NEGLIGIBLE` of them) and the time it adds to them (the recomputed forward; an
    offload's copies where they outlast the compute beside them), summed over the layers (ties
    to the smaller set). With enough host bandwidth an offload adds no time, so the ladder's
    top, which keeps least, beats its rungs below."""
    layers = [b for b in profile.blocks if b.memory]
    if not layers:
        return ()
    points: dict[MemoryChoice, tuple[float, float]] = {}
    for kinds in RECOMPUTE_SETS:
        found = [o for b in layers for o in b.memory if o.recompute == kinds]
        if len(found) == len(layers):
            points[MemoryChoice(recompute=kinds)] = (
                sum(o.saved_bytes(u) for o in found),
                sum(o.recompute_s(u) for o in found),
            )
    if host_bandwidth > 0:
        moved: dict[str, float] = {}
        for b in layers:
            for o in b.memory:
                if o.offload:
                    moved[o.offload[0]] = moved.get(o.offload[0], 0.0) + o.offload_bytes(u)
        ladder = sorted((k for k in moved if moved[k] > 0), key=lambda k: (-moved[k], k))
        for i in range(1, len(ladder) + 1):
            choice = MemoryChoice(offload=tuple(sorted(ladder[:i])))
            priced = apply(profile, choice, host_bandwidth)
            points[choice] = (
                sum(b.saved_bytes(u) for b in priced.blocks if b.memory),
                sum(
                    p.forward_s(u) + p.backward_s(u) - b.forward_s(u) - b.backward_s(u)
                    for p, b in zip(priced.blocks, profile.blocks, strict=True)
                    if b.memory
                ),
            )
    everything = sum(b.saved_bytes(u) for b in layers)

    def beats(a: MemoryChoice, b: MemoryChoice) -> bool:
        """``a`` adds no more time than ``b`` and keeps no more than :data:`NEGLIGIBLE` of the
        layers' bytes above it, and is better somewhere (or first in the choices' order)."""
        (ha, ta), (hb, tb) = points[a], points[b]
        return ha <= hb + NEGLIGIBLE * everything and ta <= tb and (ta, ha, a.key) < (tb, hb, b.key)

    kept = [c for c in points if not any(beats(other, c) for other in points if other != c)]
    return tuple(sorted(kept, key=lambda c: (points[c][1], points[c][0], c.key)))
