"""What a plan says in the units training frameworks split by: layers, and the degrees.

Megatron-LM and torchtitan cut a decoder between transformer layers, with the embedding on the
first stage and the final norm, head and loss on the last. A plan names its stages by the user's
blocks (``wte``, ``blocks.0`` .. ``blocks.5``, ``ln_f``, ``lm_head``). :func:`model_parts`
finds the layer list among the block names (the ``NAME.<index>`` prefix with the most indices:
``blocks``, ``layers``, ``model.layers``, ``transformer.h``) and says, per (virtual) stage, how
many layers start there and which blocks come before the first layer (the embedding part) or
after the last (the head and loss part). Blocks that are neither, or a layer whose blocks fall
on two stages, are reported as notes: the frameworks cannot place them as the plan does.

:func:`degrees` reads the parallel degrees from the plan: pipeline ``S`` and virtual ``v``,
data parallel ``D``, tensor parallel ``t``, sequence parallelism, the sharding of the state
over the replicas, context parallel ``cp`` and expert parallel ``ep`` / ``etp`` (plans written
before those fields load as t = 1, off, none and 1; ZeRO-1 where they said ``shard_optimizer``).
Plans recompute whole stages; selective
recomputation is asked for by the ``selective_recompute`` argument. :func:`plan_precision` reads
the precision the plan was priced in.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopipe.errors import ConfigError
from autopipe.plans import Plan
from autopipe.schedules.action import round_robin
from autopipe.schedules.registry import schedule_spec

__all__ = ["Chunk", "Degrees", "Parts", "degrees", "model_parts", "plan_precision", "stage_list"]


@dataclass(frozen=True)
class Degrees:
    """The parallel layout of a plan, in the words both frameworks use."""

    tensor: int  # t: tensor-parallel ranks per pipeline stage
    pipeline: int  # p = S: pipeline ranks
    data: int  # d = D: data-parallel replicas
    virtual: int  # v: chunks (virtual stages) per pipeline rank
    sequence_parallel: bool  # Megatron-style sequence parallelism inside the tensor-parallel group
    selective_recompute: bool  # recompute attention only (Korthikanti et al.), not whole stages
    zero1: bool = False  # some of the state sharded over the data-parallel replicas (any sharding but none)
    sharding: str = "none"  # how (modes.Sharding's names: none, zero1, zero2, zero3, zero3-step)
    shard_group: int = 0  # over how many replicas (0: all; else hybrid, replicated data / shard_group times)
    context: int = 1  # cp: context-parallel ranks splitting every sample's sequence
    expert: int = 1  # ep: expert-parallel ranks sharing each MoE layer's routed experts
    expert_tensor: int = 1  # etp: ranks splitting each routed expert
    expert_overlap: bool = False  # each MoE layer's all-to-all beside another micro-batch's compute (priced so)

    @property
    def world_size(self) -> int:
        return self.tensor * self.context * self.pipeline * self.data

    @property
    def sizes(self) -> str:
        """``t x p x d = 2 x 4 x 8 = 64 GPUs`` (``t x cp x p x d`` with context parallelism)."""
        if self.context > 1:
            named = f"t x cp x p x d = {self.tensor} x {self.context} x {self.pipeline} x {self.data}"
        else:
            named = f"t x p x d = {self.tensor} x {self.pipeline} x {self.data}"
        return f"{named} = {self.world_size} GPUs"


def degrees(
    plan: Plan,
    tensor_parallel: int | None = None,
    sequence_parallel: bool | None = None,
    selective_recompute: bool | None = None,
    zero1: bool | None = None,
) -> Degrees:
    """The plan's degrees; ``tensor_parallel`` etc. override what the plan says (or, for a plan
    without those fields, the defaults t = 1, no sequence parallelism, whole-stage recompute)."""
    t = plan.tensor_parallel if tensor_parallel is None else tensor_parallel
    sp = plan.sequence_parallel if sequence_parallel is None else sequence_parallel
    selective = bool(selective_recompute)
    sharding = str(plan.sharding) if zero1 is None else "zero1" if zero1 else "none"
    if not isinstance(t, int) or isinstance(t, bool) or t < 1:
        raise ConfigError(f"tensor parallel degree is {t!r}, expected a whole number >= 1; plan again")
    return Degrees(
        tensor=t,
        pipeline=plan.devices,
        data=plan.data_parallel,
        virtual=plan.virtual,
        sequence_parallel=bool(sp),
        selective_recompute=bool(selective),
        zero1=sharding != "none",
        sharding=sharding if plan.data_parallel > 1 else "none",
        shard_group=plan.shard_group if sharding == plan.sharding else 0,
        context=plan.context_parallel,
        expert=plan.expert_parallel,
        expert_overlap=plan.overlap.expert_comm,
        expert_tensor=plan.expert_tensor_parallel,
    )


@dataclass(frozen=True)
class Chunk:
    """One (virtual) stage of the plan, in layers."""

    index: int  # the plan's stage index (model order)
    rank: int  # the pipeline rank the plan runs it on
    layers: int  # transformer layers that start on this stage
    pre: tuple[str, ...]  # blocks before the first layer (embedding part)
    post: tuple[str, ...]  # blocks after the last layer (final norm, head, loss)


@dataclass(frozen=True)
class Parts:
    """The plan's stages in layers, and what does not fit that picture."""

    container: str  # the layer list's module name, e.g. "blocks"
    num_layers: int
    chunks: tuple[Chunk, ...]  # in stage (model) order
    notes: tuple[str, ...]  # what a layer-based framework cannot place as the plan does
    round_robin: bool  # chunk j runs on rank j % S (Megatron's and torchtitan's "loop" order)
    layer_only: tuple[str, ...] = ()  # the notes that hold only where stages are layer counts (Megatron-LM)


def stage_list(indices: list[int]) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``"0-3, 7"``."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in spans)


def _layer_of(name: str) -> tuple[str, int] | None:
    """``"model.layers.3.mlp"`` -> ``("model.layers", 3)``: the prefix before the first number."""
    parts = name.split(".")
    for k, part in enumerate(parts):
        if part.isdigit() and k > 0:
            return ".".join(parts[:k]), int(part)
    return None


def _ends(name: str) -> list[str]:
    """A block's module names: ``"wte..blocks.1"`` (blocks merged into one) -> its two ends."""
    return name.split("..")


def model_parts(plan: Plan, num_layers: int | None = None) -> Parts:
    """The plan's stages as layers; ConfigError (one line) if it has no layer list.

    ``num_layers`` is the length of the model's layer list when the caller could build the model:
    a merged block such as ``blocks.21..lm_head`` names only its ends, so without it the layers
    are counted up to the highest index a block names (layers after it stay hidden)."""
    found: dict[str, set[int]] = {}
    for stage in plan.stages:
        for name in stage.blocks:
            for end in _ends(name):
                if hit := _layer_of(end):
                    found.setdefault(hit[0], set()).add(hit[1])
    if not found:
        head = plan.stages[0].blocks[0]
        raise ConfigError(
            f"the plan of {plan.model} has no layer list (no block named like layers.0 or blocks.0; "
            f"its first block is {head!r}); Megatron-LM and torchtitan split decoders between "
            "transformer layers, so this plan cannot be handed to them"
        )
    container = max(found, key=lambda prefix: (len(found[prefix]), -len(prefix)))
    named = max(found[container]) + 1  # a module list counts from 0; merged blocks may hide some after it
    indices = list(range(max(named, num_layers or 0)))
    notes: list[str] = []
    seen: dict[int, int] = {}  # layer index -> the stage it starts on
    counts = [0] * len(plan.stages)  # per stage: layers that start there
    sides: list[tuple[list[str], list[str], list[str]]] = [([], [], []) for _ in plan.stages]  # before, after, between
    for i, stage in enumerate(plan.stages):
        for name in stage.blocks:
            ends = [_layer_of(e) for e in _ends(name)]
            idx = [h[1] for h in ends if h and h[0] == container]
            if not idx:  # not a layer: before the first, after the last, or between
                sides[i][0 if not seen else 1 if len(seen) == len(indices) else 2].append(name)
                continue
            if not (ends[0] and ends[0][0] == container):
                sides[i][0 if not seen else 2].append(name)  # a merged block that starts before a layer
            lo = (
                idx[0]
                if ends[0] and ends[0][0] == container
                else min((j for j in indices if j not in seen), default=idx[0])
            )
            hi = idx[-1] if ends[-1] and ends[-1][0] == container else indices[-1]
            for j in (j for j in indices if lo <= j <= hi):
                if j not in seen:
                    seen[j] = i
                    counts[i] += 1
                elif seen[j] != i:
                    notes.append(
                        f"layer {container}.{j} is split between stages {seen[j]} and {i} "
                        f"(block {name}); the frameworks keep a layer whole, on stage {seen[j]}"
                    )
            if not (ends[-1] and ends[-1][0] == container):
                sides[i][1].append(name)  # a merged block that ends after the last layer
    for i, (_, _, between) in enumerate(sides):
        if between:
            notes.append(
                f"blocks {', '.join(between)} (stage {i}) sit between transformer layers; "
                "the frameworks have no place for them between layers"
            )
    chunks = tuple(
        Chunk(index=i, rank=s.rank, layers=counts[i], pre=tuple(sides[i][0]), post=tuple(sides[i][1]))
        for i, s in enumerate(plan.stages)
    )
    spread = _spread_notes(chunks)
    spec = schedule_spec(plan.schedule)
    rr = all(
        spec.device_of(j, plan.devices, plan.virtual) == round_robin(j, plan.devices, plan.virtual)
        for j in range(len(plan.stages))
    )
    return Parts(
        container=container,
        num_layers=len(seen),
        chunks=chunks,
        notes=tuple(notes + spread),
        round_robin=rr,
        layer_only=tuple(spread),
    )


def _spread_notes(chunks: tuple[Chunk, ...]) -> list[str]:
    """An embedding or head part spread over several stages: a framework that places stages by
    layer counts puts it all on the first or last stage (one that places modules by name does not)."""
    notes: list[str] = []
    pre_stages = sorted({c.index for c in chunks if c.pre})
    post_stages = sorted({c.index for c in chunks if c.post})
    if pre_stages and pre_stages != [0]:
        notes.append(
            f"the embedding part ({', '.join(b for c in chunks for b in c.pre)}) spans stages "
            f"{stage_list(pre_stages)}; the frameworks put it all on the first stage"
        )
    final = len(chunks) - 1
    if post_stages and post_stages != [final]:
        notes.append(
            f"the head part ({', '.join(b for c in chunks for b in c.post)}) spans stages "
            f"{stage_list(post_stages)}; the frameworks put it all on the last stage"
        )
    return notes


def plan_precision(plan: Plan) -> str:
    """The precision the plan was priced in (:attr:`Plan.precision`; a measured plan: fp32)."""
    return plan.precision or "fp32"
