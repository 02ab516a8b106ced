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
micro-batch beside the backward chunk of another (DeepSeek-V3, Sec. 3.2.1 and Fig. 4), and
Megatron-Core's ``--overlap-moe-expert-parallel-comm`` does the same within interleaved 1F1B
(pipeline depth > 1, no full recomputation; Megatron-Bridge turns ``--delay-wgrad-compute`` on
with it). Neither hides an all-to-all behind the whole other micro-batch: each layer is split
into sub-modules -- the part before the dispatch (attention, norms, router, shared experts), the
dispatch, the routed experts (``mlp``), the combine -- and two streams run them, compute and
communication, each in order (Megatron-Core's ``TransformerLayerSchedulePlan.run``,
``megatron/core/models/common/model_chunk_schedule_plan.py``; DeepSeek-V3's Fig. 4 pairs the
same pieces)::

    compute  | attention F   | experts dgrad B, wgrad B | experts F   | attention B |
    comm     | combine B     | dispatch F, dispatch B   |             | combine F   |

so each all-to-all hides behind one sub-module of the other micro-batch, and :func:`exposed`
gives what each direction waits, per MoE layer::

    forward   max(0, dispatch - experts B) + max(0, combine - attention B)
    backward  max(0, combine_B - attention F)
              + max(0, max(dispatch, experts dgrad) + dispatch_B - max(experts B, dispatch) - experts F)

(experts B: their input and weight gradients). The pieces come from the block's times:
``BlockCost.experts_s`` the routed experts' compute (their marked ops, ``costs.experts``), the
rest of the block less its all-to-alls the part before the dispatch (a recomputed forward joins
its backward: a MoE layer's routed experts have no module kind to recompute); the
input-gradient backward (zero bubble's B) pairs the same way without weight gradients. The
block's forward and backward are priced with their own waits in place of their all-to-alls;
the search prices this only with the schedule that hides it (:func:`hiding_choices`;
``Target.hides_expert_comm``); elsewhere the all-to-all is paid in the open, as the profile
prices it. Megatron-Core's warm-up forwards and cool-down backwards run unpaired and pay their
all-to-alls in the open (:class:`Unpaired`: the first pipeline rank's share, the largest; the
block's times are that blend of hidden and open); DualPipeV's are priced as paired. The SMs the
communication kernels take from the compute beside them are priced where the source gives a
figure (``ParallelOptions.alltoall_share``: DeepEP's 20, DeepSeek-V3's 20 of the H800's 132,
Sec. 3.2.2), not for Megatron-Core's NCCL all-to-all (no figure); the experts' activation and
permutation (unmarked element-wise ops) count as the part before the dispatch.

Tests: tests/planner/cluster/test_expert_search.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

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
    "Pair",
    "Unpaired",
    "check_expert_pins",
    "context_degrees",
    "dominated",
    "expert_degrees",
    "exposed",
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
    profile: Profile,
    degrees: Degrees,
    replicas: int,
    kind: Sharding,
    shards: int,
    bytes_per_param: float,
    grad_ratio: float = 1.0,
) -> tuple[Profile, float]:
    """(``profile`` with its routed experts' bytes weighted as the module docstring says, the dense
    parameters' state factor) for ``kind`` over ``shards`` of the stage's ``replicas`` (times d cp
    devices for the dense part, the expert data-parallel group for the experts')."""
    dense = state_factor(profile, bytes_per_param, kind, shards * degrees.cp, grad_ratio)
    group = expert_gradient_group(degrees, replicas)
    experts = state_factor(profile, bytes_per_param, kind, min(group, shards * degrees.cp), grad_ratio)
    if experts == dense or not any(b.expert_params for b in profile.blocks):
        return profile, dense
    elt, ratio = element_bytes(profile), experts / dense

    def one(b: BlockCost) -> BlockCost:
        extra = b.expert_params * elt * (ratio - 1.0)
        return b if not extra else replace(b, param_bytes=round(b.param_bytes + extra))

    return replace(profile, blocks=tuple(one(b) for b in profile.blocks)), dense


@dataclass(frozen=True)
class Pair:
    """One MoE layer run for one micro-batch's forward beside another's backward (seconds at
    one micro-batch size): the compute sub-modules of Megatron-Core's fine-grained schedule and
    the four all-to-alls (module docstring)."""

    attention: float  # forward before the dispatch: attention, norms, router, shared experts
    experts: float  # forward of the routed experts, between the dispatch and the combine
    attention_grad: float  # backward of the part before the dispatch (input and weight gradients)
    experts_grad: float  # backward of the routed experts: input gradients
    experts_wgrad: float  # their weight gradients, run next (``--delay-wgrad-compute``)
    dispatch: float
    combine: float
    dispatch_grad: float  # the dispatch's backward, after the experts' input gradients
    combine_grad: float  # the combine's backward, first of the backward layer


_COMPUTE = ("attention", "experts_grad", "experts_wgrad", "experts", "attention_grad")  # the compute stream, in order
_COMM = ("combine_grad", "dispatch", "dispatch_grad", "combine")  # the communication stream, in order
_NEEDS = {  # what each sub-module waits for: its own micro-batch's one before it
    "experts_grad": "combine_grad",
    "dispatch": "attention",
    "experts": "dispatch",
    "dispatch_grad": "experts_grad",
    "attention_grad": "dispatch_grad",
    "combine": "experts",
}


def exposed(pair: Pair, share: float = 0.0) -> tuple[float, float]:
    """(forward, backward) seconds ``pair``'s all-to-alls add to its compute, as Megatron-Core's
    ``TransformerLayerSchedulePlan.run`` orders the two streams (each in order; an all-to-all
    needs its own micro-batch's compute before it, the compute after it needs it)::

        compute  | attention F   | experts dgrad B, wgrad B | experts F   | attention B |
        comm     | combine B     | dispatch F, dispatch B   |             | combine F   |

    the dispatch's backward starting once the experts' input gradients are done. What the
    compute stream waits is charged to the all-to-all it waits for (the forward's: its dispatch
    and combine). ``share``: of the device's SMs, those the all-to-all kernels hold while they
    run; the compute beside one runs at ``1 - share`` of its speed, the time lost charged to it."""
    comp, comm = list(_COMPUTE), list(_COMM)
    done: set[str] = set()
    charged = dict.fromkeys(_COMM, 0.0)
    run_c: str | None = None
    run_m: str | None = None
    left_c = left_m = 0.0
    while comp or comm or run_c or run_m:
        if run_c is None and comp and _NEEDS.get(comp[0], "") in (done | {""}):
            run_c = comp.pop(0)
            left_c = max(0.0, getattr(pair, run_c))
        if run_m is None and comm and _NEEDS.get(comm[0], "") in (done | {""}):
            run_m = comm.pop(0)
            left_m = max(0.0, getattr(pair, run_m))
        if run_c is None and run_m is None:  # cannot happen in this order; never loop forever
            raise RuntimeError(f"the paired sub-modules wait on each other: {comp} and {comm}")
        rate = 1.0 - share if run_m is not None else 1.0
        until_c = left_c / rate if run_c is not None else math.inf
        until_m = left_m if run_m is not None else math.inf
        dt = min(until_c, until_m)
        if run_m is not None:  # the compute waits on it, or runs slower beside it
            charged[run_m] += dt if run_c is None else share * dt
        if run_c is not None:
            left_c = 0.0 if dt == until_c else left_c - rate * dt
            if left_c == 0.0:
                done.add(run_c)
                run_c = None
        if run_m is not None:
            left_m = 0.0 if dt == until_m else left_m - dt
            if left_m == 0.0:
                done.add(run_m)
                run_m = None
    return charged["dispatch"] + charged["combine"], charged["combine_grad"] + charged["dispatch_grad"]


@dataclass(frozen=True)
class _Pieces:
    """A MoE block's :class:`Pair` as affine functions of the micro-batch size."""

    attention: Affine
    experts: Affine
    attention_grad: Affine
    experts_grad: Affine
    experts_wgrad: Affine
    dispatch: Affine
    combine: Affine

    def at(self, u: float) -> Pair:
        def pos(a: Affine) -> float:
            return max(0.0, a(u))

        comb = pos(self.combine)
        return Pair(
            pos(self.attention),
            pos(self.experts),
            pos(self.attention_grad),
            pos(self.experts_grad),
            pos(self.experts_wgrad),
            pos(self.dispatch),
            comb,
            comb,
            comb,
        )


@dataclass(frozen=True)
class Unpaired:
    """The chunks Megatron-Core's combined 1F1B runs unpaired on the first pipeline rank, the one
    with the most: ``warmup`` forward chunks before the steady state (as many backward chunks
    after it), of ``chunks`` chunk forwards at micro-batch size 1 (``m v`` at size ``u`` is
    ``chunks / u``). ``core_v0.14.0`` ``megatron/core/pipeline_parallel/schedules.py``,
    ``get_pp_rank_microbatches``: interleaved, ``2 (p - 1) + (v - 1) g`` warm-up forwards (``g``
    the micro-batch group per virtual stage, ``p`` by default), plus one "when enabling
    overlap_moe_expert_parallel_comm ... to ensure the forward and backward computations are
    independent in all 1f1b steps"; only the steady-state steps run a forward beside a backward
    (``combined_1f1b_schedule_for_interleaved_pipelining``), so the rest pay their all-to-alls
    in the open."""

    warmup: float
    chunks: float

    def fraction(self, u: float) -> float:
        """Of the chunks at micro-batch size ``u``, the share run unpaired."""
        return min(1.0, self.warmup * u / self.chunks) if self.chunks > 0.0 else 0.0

    @staticmethod
    def interleaved(stages: int, virtual: int | None, batch: float, replicas: int) -> Unpaired:
        """Megatron-Core's interleaved 1F1B on ``stages`` pipeline ranks of ``virtual`` chunks
        each, ``batch`` sequences over ``replicas`` pipelines (micro-batches of size 1: ``batch /
        replicas`` a replica). Where the virtual stages are not pinned, the count at any ``v``'s
        lower bound, ``p`` per ``v`` chunks (``p + (p - 1) / v`` falls towards it), so that no
        ``v`` the search may pick is charged more. Both counts are kept times ``replicas``: with
        ``v`` unpinned the share, ``stages x replicas x u / batch``, is then one value for every
        split of the same devices (the planner builds one hidden profile for them)."""
        if virtual is None:
            return Unpaired(float(stages * replicas), float(batch))
        warmup = 2.0 * (stages - 1) + (virtual - 1) * stages + 1.0
        return Unpaired(warmup * replicas, float(batch) * virtual)


@dataclass(frozen=True)
class _Hidden(Affine):
    """A MoE block's time with its all-to-alls hidden as :func:`exposed` says: ``open`` (the
    all-to-alls as priced) replaced by the waits of side ``side`` (0: forward, 1: backward) of
    ``pieces`` (the affine part is the time as priced, all-to-all included)."""

    open: Affine
    pieces: _Pieces
    side: int
    share: float = 0.0  # of the SMs, the all-to-all kernels' (``exposed``)
    unpaired: Unpaired | None = None  # the warm-up forwards and cool-down backwards, paid in the open
    # each size's value, worked out once (``exposed`` walks the two streams; the search asks
    # the same few sizes millions of times); not a field that compares or prints
    _values: dict[float, float] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __call__(self, u: float) -> float:
        hit = self._values.get(u)
        if hit is None:
            whole = self.intercept + self.slope * u
            saved = self.open(u) - exposed(self.pieces.at(u), self.share)[self.side]
            alone = self.unpaired.fraction(u) if self.unpaired is not None else 0.0
            hit = self._values[u] = whole - (1.0 - alone) * saved
        return hit

    def plus(self, other: Affine) -> Affine:
        """With ``other`` added: a recomputed forward, which Megatron-Core runs in the backward of
        the sub-module it belongs to; a MoE layer's routed experts have no module kind to
        recompute (``graph/units.py``), so it joins the backward before the dispatch."""
        pieces = replace(self.pieces, attention_grad=self.pieces.attention_grad.plus(other))
        return _Hidden(
            self.intercept + other.intercept,
            self.slope + other.slope,
            self.open,
            pieces,
            self.side,
            self.share,
            self.unpaired,
        )


def _affine(f: Callable[[float], float]) -> Affine:
    """The line through ``f`` at 1 and 2 (the all-to-all is affine in the micro-batch size)."""
    one, two = f(1.0), f(2.0)
    return Affine(one - (two - one), two - one)


def _less(a: Affine, *others: Affine) -> Affine:
    return Affine(a.intercept - sum(b.intercept for b in others), a.slope - sum(b.slope for b in others))


def hidden_profile(
    profile: Profile,
    alltoall: Callable[[float], tuple[float, float]],
    share: float = 0.0,
    unpaired: Unpaired | None = None,
) -> Profile | None:
    """``profile`` with each MoE block's all-to-alls (``alltoall(u)``: one MoE layer's forward
    (dispatch, combine) seconds, each backward one the combine's) hidden behind the paired
    micro-batch's sub-modules as :func:`exposed` says (``share``: of the SMs, the all-to-all
    kernels'), its compute split by ``BlockCost.experts_s`` (module docstring), but for the
    chunks the schedule runs ``unpaired`` (:class:`Unpaired`; None: all paired); None where
    there is none to hide."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"the all-to-all's share of the SMs must be in [0, 1) (got {share!r})")
    dispatch = _affine(lambda u: alltoall(u)[0])
    combine = _affine(lambda u: alltoall(u)[1])
    if dispatch(1.0) <= 0.0 and combine(1.0) <= 0.0:
        return None
    fwd = Affine(dispatch.intercept + combine.intercept, dispatch.slope + combine.slope)
    bwd = Affine(2.0 * combine.intercept, 2.0 * combine.slope)

    def one(b: BlockCost) -> BlockCost:
        if not b.expert_params:
            return b
        e, f, bw, bi = b.experts_s, b.forward_s, b.backward_s, b.backward_input_s
        whole = _Pieces(
            attention=_less(f, fwd, e.forward),
            experts=e.forward,
            attention_grad=_less(bw, bwd, e.backward),
            experts_grad=e.backward_input,
            experts_wgrad=_less(e.backward, e.backward_input),
            dispatch=dispatch,
            combine=combine,
        )  # the input-gradient backward (zero bubble's B) without any weight gradient
        inputs = replace(whole, attention_grad=_less(bi, bwd, e.backward_input), experts_wgrad=Affine(0.0, 0.0))
        return replace(
            b,
            forward_s=_Hidden(f.intercept, f.slope, fwd, whole, 0, share, unpaired),
            backward_s=_Hidden(bw.intercept, bw.slope, bwd, whole, 1, share, unpaired),
            backward_input_s=_Hidden(bi.intercept, bi.slope, bwd, inputs, 1, share, unpaired),
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
