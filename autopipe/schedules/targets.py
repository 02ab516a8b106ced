"""The frameworks a plan is made for (``autopipe plan --target``) and what of the search each runs as priced.

Megatron-LM runs 1F1B and interleaved 1F1B (config/megatron.py) with full recomputation on every
stage or none, selective recomputation of module kinds, the first k layers of each stage
recomputed or module kinds' activations offloaded (uniform over the layers); torchtitan the
schedules torch has a class for, its activation checkpointing one mode for all stages, and the
others from a schedule CSV with nothing recomputed (config/titan_recipe.py);
``to_torch_pipelining`` (stages/export.py) every schedule, those without a class as a schedule CSV,
and no recomputation; autopipe's executor everything. Each also says how it may split the
training state over data-parallel replicas (``modes.Sharding``'s names: Megatron-LM its
distributed optimizer and Megatron-FSDP; torchtitan and torch FSDP2, which with a pipeline
gathers the weights once a step, torch's pipeline stages keeping them until the last backward)
and what it runs beside the computation by default (``plans.Overlap``'s fields: Megatron-LM with
``--overlap-grad-reduce``, ``--overlap-param-gather`` and, interleaved only, asynchronous pipeline
sends; FSDP2 and DDP overlap their collectives; autopipe's executor posts its sends ahead and runs
no data or tensor parallelism), and whether it fuses the memory-bound ops between GEMMs into one
kernel (``fused_kernels``: Megatron-LM; costs/fusion.py prices it so). The planner
keeps its search to a target's (planner/request.py, planner/search.py); a plan records the target
it was made for (``Plan.target``), and ``autopipe config`` says when a plan made for another target
holds what the framework does not run (config/retarget.py).

Tests: tests/schedules/test_targets.py (and tests/planner/test_target_modes.py, every planning mode).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autopipe.errors import PlanError
from autopipe.schedules.registry import schedule_names, search_order

__all__ = ["SHARDINGS", "TARGETS", "DdpBuckets", "Target", "target_spec"]

SHARDINGS = ("none", "zero1", "zero2", "zero3", "zero3-step")  # modes.Sharding's values, in preference order


@dataclass(frozen=True)
class DdpBuckets:
    """How a framework cuts each chunk's once-a-step gradient reduction and weight all-gather into
    buckets and when it launches them (simulate/overlap.py prices them, ``Buckets``).

    Megatron-LM (Megatron-Core's DDP and distributed optimizer, as at the H100 table's commit
    f2e5db40 and still): a bucket holds ``max(min_params, params_per_replica x D)`` parameters
    (``DistributedDataParallel.__init__``: "make buckets larger ... at very large dp_sizes"), but only
    the first pipeline rank's first chunk is cut (``bucket_size = None`` where the pipeline rank is
    above 0, and ``disable_bucketing`` for model chunks after the first: "communication ... not on the
    critical path"); every other chunk is one bucket. Its reduction is launched by the bucket's
    gradient hooks during the chunk's last backward only on the first pipeline rank without
    interleaving (``enable_grad_sync`` there); elsewhere, with the default ``delay_grad_reduce``, as a
    whole after that backward (``grad_sync_func``, "Launch any remaining grad reductions"; interleaved,
    pipeline rank r launches it r backwards later still, to launch with the first rank: not priced,
    so the reductions of the ranks past the first may start earlier here than they do). The
    distributed optimizer's all-gathers run bucket by bucket in forward order, the first launched
    before the forward, each next one when the one before is waited on in the forward pre-hook
    (``_finish_param_sync_helper``: "we can't pre-launch all-gathers for all buckets at once")."""

    min_params: int = 40_000_000
    params_per_replica: int = 1_000_000
    hooks_interleaved: bool = False  # the first rank's first chunk reduces by hooks under interleaving too

    def counts(
        self, params: Sequence[float], ranks: Sequence[int], replicas: int, interleaved: bool
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(reduce, gather) buckets per chunk of ``params`` parameters on devices ``ranks`` (in chunk
        order), for ``replicas`` data-parallel replicas."""
        size = max(self.min_params, self.params_per_replica * replicas)
        first = {r: j for j, r in reversed(list(enumerate(ranks)))}  # each device's first chunk
        cut = [ranks[j] == 0 and first[0] == j for j in range(len(ranks))]
        gather = tuple(max(1, math.ceil(p / size)) if c else 1 for p, c in zip(params, cut, strict=True))
        hooks = not interleaved or self.hooks_interleaved
        reduce = tuple(g if hooks else 1 for g in gather)
        return reduce, gather


@dataclass(frozen=True)
class Target:
    """A framework that will run the plan, and what of the search it runs as priced (``--target``)."""

    name: str  # autopipe, megatron, torchtitan, torch
    label: str  # how messages name it: "Megatron-LM"
    schedules: tuple[str, ...]  # the schedules it runs (search order)
    uniform_recompute: bool  # it recomputes every stage or none (one mode for all stages)
    no_recompute: tuple[str, ...] = ()  # of those, the ones it runs only with nothing recomputed
    never_recomputes: bool = False  # it applies no recomputation at all
    shardings: tuple[str, ...] = SHARDINGS  # how it may split state over the replicas, with a pipeline
    shardings_alone: tuple[str, ...] | None = None  # ... and without one (one stage); None: the same
    overlaps: tuple[str, ...] = ("p2p",)  # what it overlaps with the computation (plans.Overlap's switches)
    blocking_p2p: tuple[str, ...] = ()  # of its schedules, those whose pipeline sends block the sender
    # The uniform memory choices it runs (costs/activations/choices.py; the names are graph/kinds.py's): module
    # kinds it recomputes in every layer, module kinds it offloads, the first k layers of each stage.
    recompute_modules: tuple[str, ...] = ()
    offload_modules: tuple[str, ...] = ()
    block_layers: bool = False
    # It runs the memory-bound ops between two GEMMs as one fused kernel (costs/fusion.py prices them so):
    # Megatron-LM's fused norms, bias-activations, bias-dropout-add, rotary embedding, softmax and cross entropy.
    fused_kernels: bool = False
    # The schedules with which it runs each MoE layer's all-to-all beside another micro-batch's
    # computation (DualPipeV's pairs; Megatron-Core's --overlap-moe-expert-parallel-comm, interleaved)
    hides_expert_comm: tuple[str, ...] = ()
    # It reduces the gradients of bf16 weights in fp32 (planner/placement.py prices the bytes):
    # Megatron-LM turns accumulate_allreduce_grads_in_fp32 on for --bf16 unless --grad-reduce-in-bf16
    # (training/arguments.py; its DDP reduces the fp32 main_grad buffer); torchtitan's FSDP2 reduces in
    # its mixed_precision_reduce, "float32" (the only value its config takes).
    grad_reduce_fp32: bool = False
    # How it buckets and launches the once-a-step collectives it overlaps (None: they stream with the
    # gradients and weights layer by layer, as FSDP2 reduces and gathers each module's)
    ddp_buckets: DdpBuckets | None = None

    def recomputes(self, kinds: Sequence[str]) -> bool:
        """Whether it recomputes the module kinds ``kinds`` in every layer (selective recomputation)."""
        return bool(kinds) and set(kinds) <= set(self.recompute_modules)

    def offloads(self, kinds: Sequence[str]) -> bool:
        """Whether it offloads the inputs of the module kinds ``kinds`` in every layer."""
        return bool(kinds) and set(kinds) <= set(self.offload_modules)

    def sharding_choices(self, stages: int) -> tuple[str, ...]:
        """The shardings it runs on a pipeline of ``stages`` devices."""
        return self.shardings if stages > 1 or self.shardings_alone is None else self.shardings_alone

    def recomputing(self) -> tuple[str, ...]:
        """The schedules it runs with recomputation (none where it never recomputes)."""
        return () if self.never_recomputes else tuple(s for s in self.schedules if s not in self.no_recompute)

    def restricts(self) -> bool:
        """Whether the target searches less than autopipe does."""
        return self.uniform_recompute or self.never_recomputes or set(self.schedules) != set(schedule_names())

    def runs(self, schedule: str, recompute: Sequence[bool]) -> bool:
        """Whether it runs ``schedule`` with stages recomputed as ``recompute`` says, as priced."""
        uneven = any(recompute) and not all(recompute)
        if any(recompute) and schedule not in self.recomputing():
            return False
        return schedule in self.schedules and not (self.uniform_recompute and uneven)

    def searched(self) -> str:
        """``1f1b or interleaved-1f1b, every stage recomputed or none``: what its search keeps to."""
        if set(self.schedules) == set(schedule_names()):
            said = "any schedule"
        elif len(self.schedules) == 1:
            said = self.schedules[0]
        else:
            said = ", ".join(self.schedules[:-1]) + " or " + self.schedules[-1]
        if self.never_recomputes:
            return said + ", nothing recomputed"
        if self.no_recompute:
            said += f" ({', '.join(self.no_recompute)} with nothing recomputed)"
        said += ", every stage recomputed or none" if self.uniform_recompute else ""
        if self.recompute_modules and not self.uniform_recompute:
            return said
        forms = [
            "selective recomputation" if self.recompute_modules else "",
            "the block method" if self.block_layers else "",
            "activation offload" if self.offload_modules else "",
        ]
        named = [f for f in forms if f]
        return said + (", or " + ", ".join(named[:-1]) + " or " + named[-1] if len(named) > 1 else "")


def _targets() -> tuple[Target, ...]:
    every = tuple(s.name for s in search_order())
    megatron = tuple(s.name for s in search_order() if s.torch_class in ("Schedule1F1B", "ScheduleInterleaved1F1B"))
    # torchtitan runs what torch has a class for, and the rest from a schedule CSV
    # (pipeline_parallel_schedule_csv, config/titan_recipe.py), which has no recomputation action
    csv = tuple(s.name for s in search_order() if not s.torch_class)
    # FSDP2 (torchtitan's data_parallel_shard_degree, or the user's fully_shard around torch's stages)
    # reshards per micro-batch without a pipeline and gathers once a step with one
    fsdp, alone = ("none", "zero3-step"), ("none", "zero3")
    overlapping = ("grad_reduce", "param_gather", "p2p")
    # Megatron-LM's --recompute-modules for a dense layer (moe_act is an MoE expert's activation, not
    # the dense mlp_act) and Megatron-Core's --offload-modules (arguments.py, transformer_config.py)
    selective = ("core_attn", "layernorm", "mlp")
    offload = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm")
    return (
        Target(
            "autopipe",
            "autopipe's executor",
            every,
            False,
            recompute_modules=(*selective, "mlp_act"),
            offload_modules=offload,
            block_layers=True,
            hides_expert_comm=("dualpipe-v",),
        ),
        Target(
            "megatron",
            "Megatron-LM",
            megatron,
            True,
            shardings=("none", "zero1", "zero2", "zero3"),
            overlaps=overlapping,
            blocking_p2p=("1f1b",),  # validate_args turns overlap_p2p_comm off without interleaving
            recompute_modules=(*selective, "mla_up_proj"),  # and MLA's up-projections (recompute_up_proj)
            offload_modules=offload,
            block_layers=True,
            fused_kernels=True,  # megatron/core/fusions/ and Transformer Engine's fused modules
            hides_expert_comm=("interleaved-1f1b",),
            grad_reduce_fp32=True,
            ddp_buckets=DdpBuckets(),
        ),
        Target(
            "torchtitan",
            "torchtitan",
            every,
            True,
            no_recompute=csv,
            shardings=fsdp,
            shardings_alone=alone,
            overlaps=overlapping,
            hides_expert_comm=("dualpipe-v",),
            grad_reduce_fp32=True,
        ),
        # to_torch_pipelining builds torch's stages as traced: no activation checkpointing
        Target(
            "torch",
            "torch.distributed.pipelining",
            every,
            False,
            never_recomputes=True,
            shardings=fsdp,
            shardings_alone=alone,
            overlaps=overlapping,
        ),
    )


TARGETS = tuple(t.name for t in _targets())
"""The ``--target`` names; the first, autopipe, is the default (everything)."""


def target_spec(name: str) -> Target:
    """The :class:`Target` called ``name``; PlanError (one line) for another name."""
    for t in _targets():
        if t.name == name:
            return t
    raise PlanError(f"unknown target {name!r}; use one of {', '.join(TARGETS)}")
