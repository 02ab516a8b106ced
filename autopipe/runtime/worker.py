"""One rank of a run: rebuild the model from the plan, keep this rank's stages, train.

Every rank rebuilds the whole model the same way (``torch.manual_seed(seed)`` right before the
factory, so all ranks hold identical initial weights), re-traces it at the plan's micro-batch
size, checks the trace's fingerprint against the plan's, splits it and keeps its own stages.

Data (:func:`make_batch`): step ``k`` seeds the global RNG with ``seed + k + 1`` and calls the
model file's ``example_inputs(batch_size)`` / ``example_targets(batch_size)``: a file that draws
from the global RNG gets a new batch each step, a file with its own fixed generator
(models/*.py) the same batch every step. All ranks make the same batch and cut the same
micro-batches. Ranks run as threads share that RNG with each other's recomputation (which
sets and restores it), so :func:`~autopipe.runtime.local.run_threads` draws the batches
before its threads start and hands them in (``batches``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autopipe.errors import PlanError, RuntimeFailure
from autopipe.graph.outputs import output_builder
from autopipe.graph.trace import TracedModel
from autopipe.model.load import LoadedModel
from autopipe.plans import Plan
from autopipe.runtime import checkpoint
from autopipe.runtime.comm import Comm
from autopipe.runtime.engine import IterationResult, PipelineEngine
from autopipe.runtime.meters import state_bytes
from autopipe.runtime.microbatch import flat_inputs, split_batch, split_flat
from autopipe.runtime.options import RunOptions
from autopipe.runtime.order import message_order
from autopipe.runtime.routing import make_routing
from autopipe.runtime.shapes import value_specs
from autopipe.schedules import Action, Schedule, schedule_spec
from autopipe.stages.rebuild import rebuild_model, trace_for_plan
from autopipe.stages.split import Split, split_model

__all__ = ["Batch", "RankResult", "Rebuilt", "make_batch", "plan_schedule", "rebuild", "shared_groups", "train_rank"]

Batch = tuple[list[Any], Any]  # one step's flat graph inputs and targets (None without targets)


@dataclass(frozen=True)
class Rebuilt:
    """The model of a plan, rebuilt and traced (one per rank: each rank owns its weights)."""

    loaded: LoadedModel
    traced: TracedModel

    def copy(self) -> Rebuilt:
        return Rebuilt(self.loaded, copy.deepcopy(self.traced))


@dataclass(frozen=True)
class RankResult:
    """What one rank measured; plain values, JSON-ready."""

    rank: int
    stages: tuple[int, ...]
    iterations: tuple[IterationResult, ...]
    static_bytes: int  # parameters + gradients + optimizer state of the rank's stages
    peak_memory_bytes: int
    memory_kind: str  # how peak_memory_bytes was measured
    steps_done: int  # including those of a resumed checkpoint


def rebuild(plan: Plan, seed: int = 0, base: str | None = None) -> Rebuilt:
    """Build and trace the plan's model; PlanError when it no longer matches the plan.

    A relative model file is looked for from the working directory, then from ``base``.
    """
    loaded = rebuild_model(plan, seed=seed, base=base)
    loaded.model.train()
    inputs = loaded.make_inputs(plan.micro_batch_size)
    return Rebuilt(loaded, trace_for_plan(plan, loaded.model, inputs, source=loaded.spec.path))


def make_batch(rebuilt: Rebuilt, plan: Plan, seed: int, step: int) -> Batch:
    """Step ``step``'s whole batch (``plan.batch_size`` samples), drawn after seeding the RNG."""
    B = plan.batch_size
    torch.manual_seed(seed + step + 1)
    names = [str(n.target) for n in rebuilt.traced.gm.graph.nodes if n.op == "placeholder"]
    inputs = flat_inputs(names, rebuilt.loaded.make_inputs(B))
    make_targets = rebuilt.loaded.make_targets
    return inputs, (make_targets(B) if make_targets is not None else None)


def shared_groups(split: Split) -> list[tuple[str, tuple[int, ...]]]:
    """Shared parameters held by more than one rank, with those ranks (sorted)."""
    rank_of = {st.index: st.rank for st in split.stages}
    out = []
    for name, stages in split.shared_params:
        holders = tuple(sorted({rank_of[s] for s in stages}))
        if len(holders) > 1:
            out.append((name, holders))
    return out


def action_seconds(plan: Plan) -> Callable[[Action], float]:
    """The plan's predicted duration of an action (recomputation included); 1, 2, 1 for F, B,
    W when the plan has no predictions (made by hand, say)."""
    split = schedule_spec(plan.schedule).splits_backward
    stages = {st.index: st for st in plan.stages}
    predicted = any(st.forward_s > 0 for st in plan.stages)

    def seconds(a: Action) -> float:
        st = stages[a.stage]
        if not predicted:
            return 2.0 if a.kind == "B" else 1.0
        if a.kind == "F":
            return st.forward_s
        if a.kind == "W":
            return st.backward_weight_s
        return st.backward_input_s if split else st.backward_s

    return seconds


def plan_schedule(plan: Plan) -> Schedule:
    """The plan's action lists; PlanError if the plan puts a stage on another device than its
    schedule does (a plan edited by hand)."""
    spec = schedule_spec(plan.schedule)
    placed = spec.devices_of(plan.devices, plan.virtual)
    for st in plan.stages:
        if st.index < len(placed) and st.rank != placed[st.index]:
            raise PlanError(
                f"stage {st.index} of the plan is on device {st.rank}, but the {spec.name} schedule "
                f"runs it on device {placed[st.index]}; plan again or set its rank to {placed[st.index]}"
            )
    return spec.make(plan.devices, plan.micro_batches, plan.virtual)


def make_optimizer(params: list[torch.nn.Parameter], options: RunOptions) -> torch.optim.Optimizer:
    cls = getattr(torch.optim, options.optimizer, None)
    if cls is None or not isinstance(cls, type) or not issubclass(cls, torch.optim.Optimizer):
        raise RuntimeFailure(
            f"unknown optimizer {options.optimizer!r}; name a torch.optim class such as SGD, Adam or AdamW"
        )
    extra: dict[str, Any] = dict(options.optimizer_kwargs)
    opt: torch.optim.Optimizer = cls(params, lr=options.lr, **extra)  # type: ignore[call-arg]
    return opt


def train_rank(
    plan: Plan,
    rank: int,
    comm_factory: Callable[[list[tuple[int, ...]]], Comm],
    options: RunOptions,
    rebuilt: Rebuilt | None = None,
    batches: Callable[[int], Batch] | None = None,
) -> RankResult:
    """Run ``options.steps`` optimizer steps of ``plan`` as ``rank``.

    ``batches(k)`` gives step ``k``'s batch; by default the rank draws it with :func:`make_batch`.
    """
    S = plan.devices
    rb = rebuilt if rebuilt is not None else rebuild(plan, options.seed, options.model_base)
    schedule = plan_schedule(plan)
    split = split_model(rb.traced, plan)
    groups = shared_groups(split)
    comm = comm_factory([g for _, g in groups])
    device = (
        torch.device(f"cuda:{torch.cuda.current_device()}")
        if options.device == "cuda"
        else torch.device("cpu")
    )
    u = plan.micro_batch_size
    example = flat_inputs(
        [str(n.target) for n in rb.traced.gm.graph.nodes if n.op == "placeholder"],
        rb.loaded.make_inputs(u),
    )
    specs = value_specs(rb.traced.gm, example)
    mine = [st for st in split.stages if st.rank == rank]
    for st in mine:
        st.module.to(device)
    params = list(
        dict.fromkeys(p for st in mine for p in st.module.parameters() if p.requires_grad)
    )
    optimizer = make_optimizer(params, options)
    by_name = dict(rb.traced.gm.named_parameters())
    shared = [(by_name[name], holders) for name, holders in groups if rank in holders]
    routing = make_routing(split, S, plan.micro_batches)
    order = message_order(schedule, routing, specs, action_seconds(plan))
    engine = PipelineEngine(
        mine,
        schedule[rank],
        routing,
        specs,
        comm,
        order=order[rank],
        input_names=split.input_names,
        output_names=split.output_names,
        make_output=output_builder(
            rb.traced.gm, rb.traced.tracer, rb.loaded.model, rb.loaded.make_inputs(u)
        ),
        loss_fn=rb.loaded.loss_fn,
        optimizer=optimizer,
        shared=shared,
        recompute=[s.index for s in plan.stages if s.recompute],
        last_stage=split.last.index,
        device=device,
    )
    done = 0
    if options.resume:
        done = checkpoint.load_rank(options.resume, rank, mine, optimizer, plan.recipe.fingerprint)
    iterations = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for k in range(done, done + options.steps):
        B, m = plan.batch_size, plan.micro_batches
        inputs, targets = batches(k) if batches is not None else make_batch(rb, plan, options.seed, k)
        batch, targets = [_to(v, device) for v in inputs], _to(targets, device)
        iterations.append(
            engine.train_step(split_flat(batch, B, m), split_batch(targets, B, m), k)
        )
    static = state_bytes(params, optimizer)
    if device.type == "cuda":
        peak, kind = int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    else:
        peak = static + max((it.peak_activation_bytes for it in iterations), default=0)
        kind = "cpu count: parameters + gradients + optimizer state + peak saved activations"
    if options.save_checkpoint:
        names = checkpoint.aliases(rb.loaded.model)
        checkpoint.save_rank(
            options.save_checkpoint, rank, mine, optimizer, done + options.steps, names
        )
        comm.barrier()
        if rank == 0:
            checkpoint.write_meta(
                options.save_checkpoint, plan.recipe.fingerprint, done + options.steps, len(split.stages)
            )
    return RankResult(
        rank,
        tuple(st.index for st in mine),
        tuple(iterations),
        static,
        peak,
        kind,
        done + options.steps,
    )


def _to(x: Any, device: torch.device) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x
    )
