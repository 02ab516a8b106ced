"""Expert and context parallelism in the cluster search: which degrees to search, the training
state of a layout whose parts are sharded over two groups, and the expert all-to-all hidden where
the target overlaps it (``costs.options`` prices one device's profile per degrees).

**Degrees** (:func:`context_degrees`, :func:`expert_degrees`): for each ``t``, context
parallelism ``cp`` over the divisors of ``G / t`` that split the sequence into ``2 cp`` chunks
(Megatron's load balancing) and leave each rank at least :data:`MIN_CONTEXT_TOKENS` tokens (a
pinned ``cp`` may go below); for each stage of ``t cp d`` devices, expert parallelism ``ep`` over
the divisors of E and of ``t cp d / etp``, with ``etp`` (expert tensor parallelism) 1, or as
pinned (Megatron-Core's default is t; the published MoE layouts, DeepSeek-V3's and
Megatron-Bridge's, all run 1, and searching t too doubles the pipeline searches). Megatron-Core's rules:
the world size divisible by ``etp x ep x p`` and E by ``ep`` (``costs.options.layout_reason``).

**State** (:func:`state_profile`): a distributed optimizer shards the dense parameters' state
over the stage's ``d cp`` devices and the routed experts' over their expert data-parallel group,
``t cp d / (ep etp)`` devices (``costs.options.expert_gradient_group``), so a device keeps, per
byte of its parameters, ``f_dense`` bytes of the dense ones and ``f_expert`` of the experts'
(``placement.state_bytes``). The pipeline search takes one factor per parameter byte; the profile
it is given carries the experts' bytes scaled by ``f_expert / f_dense`` (times unchanged), so
that one factor prices both::

    static bytes of a block = (dense + expert x f_expert / f_dense) x f_dense

**Dominance** (:func:`dominated`): on the same stage, a larger ep holds fewer expert parameters
(less state, less to reduce each step) and the same activations; where its blocks also take no
longer at any micro-batch size the search can use, the smaller ep cannot give a faster plan and
is not searched (an exact pruning: within a node the fuller expert GEMMs of a larger ep usually
win; across nodes its all-to-all usually costs more, and both are searched).

**The all-to-all hidden** (:func:`hidden_profile`): DualPipeV runs the forward chunk of one
micro-batch beside the backward chunk of another (DeepSeek-V3, Sec. 3.2.1), and Megatron-Core's
``--overlap-moe-expert-parallel-comm`` does the same within interleaved 1F1B (pipeline depth > 1,
no full recomputation): each MoE layer's dispatch and combine run under the other micro-batch's
computation. Per block holding a MoE layer, with ``a_f, a_b`` its all-to-all (forward,
backward; ``options.alltoall``) and ``c_f, c_b`` its computation (its times less them)::

    forward  c_f + a_f - min(a_f, c_b)        backward  c_b + a_b - min(a_b, c_f)

(the same for the input-gradient backward), which the search prices only with the schedule that
hides it (:func:`hiding_choices`; ``Target.hides_expert_comm``); elsewhere the all-to-all is
paid in the open, as the profile prices it.

Tests: tests/planner/cluster/test_expert_search.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from autopipe.costs.options import Layout as Degrees
from autopipe.costs.options import ParallelOptions, expert_gradient_group, layout_reason
from autopipe.costs.profile import Affine, BlockCost, Profile
from autopipe.errors import PlanError
from autopipe.modes import Recompute, Sharding
from autopipe.planner.cluster.sharding import element_bytes, state_factor
from autopipe.planner.request import Choices, divisors
from autopipe.schedules.targets import target_spec

__all__ = [
    "MIN_CONTEXT_TOKENS",
    "check_expert_pins",
    "context_degrees",
    "dominated",
    "expert_degrees",
    "hidden_profile",
    "hiding_choices",
    "state_profile",
]

MIN_CONTEXT_TOKENS = 4096  # the least tokens per context-parallel rank the free search splits a sequence into


def context_degrees(
    parallel: ParallelOptions | None, devices: int, t: int, pinned: int | None
) -> tuple[list[int], list[tuple[int, str]]]:
    """The cp to search beside ``t`` on ``devices`` (``pinned``: that one, checked; PlanError
    when it cannot be used) and the divisors skipped with why."""
    if pinned is not None:
        why = "" if pinned == 1 else _context_reason(parallel, devices, t, pinned)
        if why:
            raise PlanError(f"--context-parallel {pinned}: {why}; pick another or leave it to the search")
        return [pinned], []
    if parallel is None or parallel.context is None:
        return [1], []
    ok, skipped = [1], []
    for cp in divisors(devices // t)[1:]:
        why = _context_reason(parallel, devices, t, cp)
        if not why and parallel.context.seq // cp < MIN_CONTEXT_TOKENS:
            why = (
                f"leaves {parallel.context.seq // cp} tokens per rank, under {MIN_CONTEXT_TOKENS} (pin it to search it)"
            )
        if why:
            skipped.append((cp, why))
        else:
            ok.append(cp)
    return ok, skipped


def _context_reason(parallel: ParallelOptions | None, devices: int, t: int, cp: int) -> str:
    if parallel is None:
        return "the model has no attention autopipe can split by sequence (context parallelism needs an analytic plan)"
    if devices % (t * cp):
        return f"t={t} x cp={cp} does not divide {devices} devices"
    return layout_reason(parallel, Degrees(t, cp), devices)


def check_expert_pins(parallel: ParallelOptions | None, ep: int | None, etp: int | None) -> None:
    """PlanError (one line) for a pinned ep or etp the model cannot take, whatever the layout."""
    for flag, value in (("--expert-parallel", ep), ("--expert-tensor-parallel", etp)):
        if value is not None and value > 1 and (parallel is None or parallel.experts is None):
            raise PlanError(
                f"{flag} {value}: the model has no routed experts autopipe can find "
                "(expert parallelism needs an analytic plan of a MoE); drop it"
            )
    if ep is not None and parallel is not None and parallel.experts is not None and parallel.experts.experts % ep:
        E = parallel.experts.experts
        raise PlanError(f"--expert-parallel {ep} does not divide the {E} experts; use a divisor of {E}")


def expert_degrees(
    parallel: ParallelOptions | None, t: int, cp: int, stage_devices: int, pinned: tuple[int | None, int | None]
) -> list[tuple[int, int]]:
    """The (ep, etp) to search on a stage of ``stage_devices`` = t cp d devices: ``pinned`` (ep,
    etp) where given, else every ep dividing E and the stage's devices / etp, etp 1."""
    ep_pin, etp_pin = pinned
    if parallel is None or parallel.experts is None:
        return [(1, 1)] if ep_pin in (None, 1) and etp_pin in (None, 1) else []
    etps = [etp_pin] if etp_pin is not None else [1]
    out = []
    for etp in etps:
        eps = [ep_pin] if ep_pin is not None else divisors(stage_devices // etp) if stage_devices % etp == 0 else []
        for ep in eps:
            if not layout_reason(parallel, Degrees(t, cp, ep, etp), stage_devices):
                out.append((ep, etp))
    return out


def state_profile(
    profile: Profile, degrees: Degrees, replicas: int, kind: Sharding, shards: int, bytes_per_param: float
) -> tuple[Profile, float]:
    """(``profile`` with its routed experts' bytes weighted as the module docstring says, the dense
    parameters' state factor) for ``kind`` over ``shards`` of the stage's ``replicas`` (times d cp
    devices for the dense part, the expert data-parallel group for the experts')."""
    dense = state_factor(profile, bytes_per_param, kind, shards * degrees.cp)
    group = expert_gradient_group(degrees, replicas)
    experts = state_factor(profile, bytes_per_param, kind, min(group, shards * degrees.cp))
    if experts == dense or not any(b.expert_params for b in profile.blocks):
        return profile, dense
    elt, ratio = element_bytes(profile), experts / dense

    def one(b: BlockCost) -> BlockCost:
        extra = b.expert_params * elt * (ratio - 1.0)
        return b if not extra else replace(b, param_bytes=round(b.param_bytes + extra))

    return replace(profile, blocks=tuple(one(b) for b in profile.blocks)), dense


@dataclass(frozen=True)
class _Hidden(Affine):
    """A MoE block's time with its all-to-all ``comm`` hidden behind up to ``other`` of the paired
    micro-batch's computation (the affine part is the time as priced, all-to-all included)."""

    comm: Affine
    other: Affine

    def __call__(self, u: float) -> float:
        whole = self.intercept + self.slope * u
        return whole - min(self.comm(u), max(0.0, self.other(u)))


def _affine(f: Callable[[float], float]) -> Affine:
    """The line through ``f`` at 1 and 2 (the all-to-all is affine in the micro-batch size)."""
    one, two = f(1.0), f(2.0)
    return Affine(one - (two - one), two - one)


def hidden_profile(profile: Profile, alltoall: Callable[[float], tuple[float, float]]) -> Profile | None:
    """``profile`` with each MoE block's all-to-all (``alltoall(u)``: one MoE layer's (forward,
    backward) seconds) hidden behind the paired micro-batch's computation (module docstring);
    None where there is none to hide."""
    fwd = _affine(lambda u: alltoall(u)[0])
    bwd = _affine(lambda u: alltoall(u)[1])
    if fwd(1.0) <= 0.0 and bwd(1.0) <= 0.0:
        return None

    def less(a: Affine, b: Affine) -> Affine:
        return Affine(a.intercept - b.intercept, a.slope - b.slope)

    def one(b: BlockCost) -> BlockCost:
        if not b.expert_params:
            return b
        f, bw, bi = b.forward_s, b.backward_s, b.backward_input_s
        cf, cb = less(f, fwd), less(bw, bwd)
        return replace(
            b,
            forward_s=_Hidden(f.intercept, f.slope, fwd, cb),
            backward_s=_Hidden(bw.intercept, bw.slope, bwd, cf),
            backward_input_s=_Hidden(bi.intercept, bi.slope, bwd, cf),
        )

    return replace(profile, blocks=tuple(one(b) for b in profile.blocks))


def hiding_choices(choices: Choices, stages: int) -> Choices | None:
    """``choices`` with the schedule of the target that hides the expert all-to-all
    (``Target.hides_expert_comm``), or None where it cannot: the schedule or recomputation pinned
    otherwise; Megatron's interleaved 1F1B on one stage, or with every stage (or the first layers
    of each, the block method) recomputed whole; selective recomputation pinned stays."""
    hides = target_spec(choices.target).hides_expert_comm
    if not hides or stages < 2 or (choices.schedule is not None and choices.schedule not in hides):
        return None
    schedule = choices.schedule or hides[0]
    if schedule == "interleaved-1f1b":  # Megatron-Core refuses the overlap with full recomputation
        if choices.recompute == Recompute.ALWAYS or choices.recompute_layers:
            return None
        if choices.recompute_modules:  # selective: no stage recomputed whole already (Megatron-Bridge's
            return replace(choices, schedule=schedule)  # DeepSeek-V3 H100 recipe runs it with the overlap)
        return replace(choices, schedule=schedule, recompute=Recompute.NEVER)
    return replace(choices, schedule=schedule)


def dominated(priced: Sequence[tuple[Degrees, Profile]], sizes: Sequence[float]) -> set[int]:
    """Indices of ``priced`` (one stage's layouts, same t and cp) whose blocks no layout with a
    larger ep and the same etp beats at none of ``sizes``: each is dominated by that one (module
    docstring)."""
    out = set()
    for i, (a, pa) in enumerate(priced):
        for b, pb in priced:
            if b.ep > a.ep and b.etp == a.etp and _no_slower(pb, pa, sizes):
                out.add(i)
                break
    return out


def _no_slower(fast: Profile, slow: Profile, sizes: Sequence[float]) -> bool:
    """Whether every block of ``fast`` takes no longer and saves no more than ``slow``'s at ``sizes``."""
    for x, y in zip(fast.blocks, slow.blocks, strict=True):
        for u in sizes:
            for f in ("forward_s", "backward_s", "backward_input_s", "backward_weight_s", "saved_bytes"):
                if getattr(x, f)(u) > getattr(y, f)(u) * (1 + 1e-12):
                    return False
    return True
