"""Hand a plan to ``torch.distributed.pipelining``: the stages this rank owns and the schedule.

    stages, schedule = to_torch_pipelining(plan, model, rank, example_inputs=x_u, loss_fn=loss)
    schedule.step(*pipeline_inputs(stages, x), target=y if stages[-1].is_last else None)
    sync_shared_grads(stages)               # tied weights (every rank calls it)
    optimizer.step()

``x`` is one batch of the model's inputs as the model takes them (a tensor, a tuple of
positional inputs, a dict of keyword inputs); ``x_u`` one micro-batch of them.
:func:`pipeline_inputs` flattens ``x`` in the order the first stage takes it (the traced
graph's inputs) and gives ``()`` on the other ranks; torch splits every input and the target
along dim 0 into ``plan.micro_batches`` micro-batches.

torch's pipelining sends one tuple of tensors from stage j to stage j + 1 and nothing else, so
each stage module is wrapped in a :class:`RelayStage`: it takes the tuple stage j-1 sent,
runs the stage, and sends on everything a later stage still needs -- its own outputs and the
values it received that skip past it (a U-Net's long skip connections, a model input read
late); every value it sends is made contiguous (torch's P2P needs it). The last stage returns
the model's outputs flat (torch's stages hold tensors only), and ``loss_fn(output, target)``
gets them as the model returns them -- a tensor, a tuple, a dict, a Hugging Face
``ModelOutput`` (rebuilt by :func:`~autopipe.graph.outputs.output_builder`); ``schedule.step``
returns the flat outputs on the last rank.

Schedules: each schedule's spec names its torch class (``ScheduleSpec.torch_class``):
``gpipe`` -> ScheduleGPipe, ``1f1b`` -> Schedule1F1B, ``interleaved-1f1b`` ->
ScheduleInterleaved1F1B (``virtual`` stages per rank, placed as the plan says), ``zb-h1`` ->
ScheduleInterleavedZeroBubble (torch's ZB schedule; with one stage per rank it is ZB-H1-like),
``zb-v`` -> ScheduleZBVZeroBubble, ``dualpipe-v`` -> ScheduleDualPipeV (two stages per rank, in a V).
Schedules whose spec names no class (``zb-h2``, ``v-half``, ``v-min``) run as data: torch's
``_PipelineScheduleRuntime`` loads the plan's exact per-rank order as a schedule CSV
(:mod:`~autopipe.stages.schedule_csv`) through its own ``_load_csv``, which reads the stage -> rank
placement off the rows (a V as the plan places it) and adds the sends and receives. (``dualpipe-v``
keeps ScheduleDualPipeV: its order is autopipe's, with an I next to its W run as one full backward.)

Each micro-batch's mean loss trains as ``loss / n_microbatches`` (its gradient is divided,
not its value, so ``losses`` reads as the loss), and torch's own gradient scaling
(``scale_grads``) is off, so a step's gradients are the full batch's, as autopipe's engine
computes them, and they accumulate over steps like ``loss.backward()``'s.

Tied weights (a GPT's embedding and LM head; BART's encoder embedding, decoder embedding and
LM head): the stages of one rank that use a tied weight hold the one Parameter of the model,
whose gradient accumulates their contributions. Across ranks, each rank updates the copy in
its own model, so its gradients must be summed across the ranks that use it after every
``schedule.step`` and before ``optimizer.step`` -- :func:`sync_shared_grads` does that with
one all-reduce per tied tensor over the pipeline group (each rank adds its copy once, however
many of its stages use it; ranks that do not use it add zeros). Built this way, training
matches the unsplit model under every schedule, however it places the stages that share a
weight (tests/stages/test_export.py: a three-way tie under interleaved 1F1B, ZB-V, DualPipe-V).

For ``nn.Sequential`` pipelines (torchgpipe, ``torch.distributed.pipelining.pipeline`` with
split points), ``plan.balance`` gives the number of blocks per stage; when the model's blocks
are the Sequential's children, that is the layer count per stage they take.
"""

from __future__ import annotations

import csv
import inspect
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
from torch import nn

from autopipe.errors import PlanError
from autopipe.graph.outputs import output_builder
from autopipe.graph.trace import TracedModel
from autopipe.plans import Plan
from autopipe.schedules import SPECS, schedule_names, schedule_spec
from autopipe.schedules.torch_limits import torch_refusal
from autopipe.stages.agree import agreed_split
from autopipe.stages.rebuild import trace_for_plan
from autopipe.stages.schedule_csv import torch_rows
from autopipe.stages.split import Split, StageModule, split_model
from autopipe.stages.state import Slot, state_slots
from autopipe.stages.torch_stage import SplitBackwardStage

__all__ = [
    "SCHEDULE_CLASSES",
    "RelayStage",
    "agreed_trace",
    "pipeline_inputs",
    "relay_stages",
    "sync_shared_grads",
    "take_shared_grads",
    "to_torch_pipelining",
]

SCHEDULE_CLASSES = {spec.name: spec.torch_class for spec in SPECS if spec.torch_class}  # name -> torch class


class RelayStage(nn.Module):
    """Stage ``index`` with one tuple in and one tuple out (the values ``carry_out`` names)."""

    def __init__(
        self,
        stage: StageModule,
        carry_in: Sequence[str],
        carry_out: Sequence[str],
        model_output: Sequence[str] | None,
        output_is_tuple: bool,
    ) -> None:
        super().__init__()
        self.index = stage.index
        self.stage = stage.module
        self.inputs = tuple(stage.inputs)
        self.outputs = tuple(stage.outputs)
        self.carry_in = tuple(carry_in)
        self.carry_out = tuple(carry_out)
        self.model_output = None if model_output is None else tuple(model_output)
        self.output_is_tuple = output_is_tuple
        self.tied: dict[str, nn.Parameter] = {}  # tied parameters this stage uses, by model name
        self.tied_ranks: tuple[tuple[str, tuple[int, ...], tuple[int, ...], str], ...] = ()  # all, every rank
        self.slots: tuple[Slot, ...] = ()  # the model's state_dict entries this stage holds or keeps

    def forward(self, *args: torch.Tensor) -> Any:
        env = dict(zip(self.carry_in, args, strict=True))
        made = self.stage(*[env[n] for n in self.inputs])
        relayed = {n: _relay(env[n]) for n in self.carry_out if n in env}
        env.update(zip(self.outputs, made, strict=True))
        env.update(relayed)
        if self.model_output is not None:
            out = tuple(env[n] for n in self.model_output)  # flat: torch's stages take tensors only
            return out if self.output_is_tuple else out[0]
        return tuple(_sendable(env[n]) for n in self.carry_out)


def _relay(t: torch.Tensor) -> torch.Tensor:
    # A value passed through untouched still gets an autograd node of this stage, so its
    # gradient flows back through the pipeline like any other output's.
    return t.view_as(t) if t.requires_grad else t


def _sendable(t: torch.Tensor) -> torch.Tensor:
    # torch's P2P sends need contiguous tensors (a transposed or expanded value is not).
    return t if t.is_contiguous() else t.contiguous()


def relay_stages(split: Split, order: dict[str, int]) -> list[RelayStage]:
    """Every stage of ``split`` wrapped for a linear pipeline (``order``: value -> graph position)."""
    maker = {n: -1 for n in split.input_names}
    readers: dict[str, set[int]] = {}
    for st in split.stages:
        maker.update({n: st.index for n in st.outputs})
        for n in st.inputs:
            readers.setdefault(n, set()).add(st.index)
    last = len(split.stages) - 1
    outputs = [n for n in split.output_names if n is not None]
    if len(outputs) != len(split.output_names):
        raise PlanError(
            "the model returns a non-tensor value, which torch.distributed.pipelining cannot send; return tensors only"
        )
    for n in outputs:
        readers.setdefault(n, set()).add(last + 1)  # the model output is read after the last stage

    def carry(j: int) -> tuple[str, ...]:  # values made before stage j and read at j or later
        if j == 0:
            return tuple(split.input_names)
        live = [n for n, m in maker.items() if m < j and any(r >= j for r in readers.get(n, ()))]
        return tuple(sorted(live, key=lambda n: order.get(n, -1)))

    return [
        RelayStage(
            st,
            carry(st.index),
            carry(st.index + 1) if st.index < last else (),
            outputs if st.index == last else None,
            split.output_is_tuple,
        )
        for st in split.stages
    ]


def to_torch_pipelining(
    plan: Plan,
    model: nn.Module,
    rank: int,
    *,
    example_inputs: Any,
    device: str | torch.device = "cpu",
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    group: dist.ProcessGroup | None = None,
    scale_grads: bool = True,
) -> tuple[list[Any], Any]:
    """The ``PipelineStage``(s) ``rank`` owns and the torch schedule matching ``plan``.

    ``example_inputs`` is one micro-batch (``plan.micro_batch_size`` samples) of the model's
    inputs, used to trace the model as the plan was traced. ``model`` is the full model, on
    every rank; the stages hold its own parameters (moved to ``device``), so an optimizer over
    ``[p for s in stages for p in s.submod.parameters()]`` trains them in place.
    Without ``loss_fn`` the schedule runs forward only. ``scale_grads``: ``loss_fn`` is a mean,
    so each micro-batch's loss trains as ``loss / plan.micro_batches`` (its reported value is
    the loss itself) and a step's gradients are the whole batch's; False for a summed loss.
    torch's own ``scale_grads`` is turned off: it divides every parameter of a stage once per
    stage, so a parameter two stages of one rank share (a tied embedding and LM head) would be
    divided twice, and gradients accumulated over several steps would be divided again.
    Every rank of ``group`` calls it: the ranks agree on their traces first (:func:`agreed_trace`).
    """
    if not 0 <= rank < plan.devices:
        raise PlanError(f"rank {rank} is outside the plan's {plan.devices} pipeline ranks; use 0 to {plan.devices - 1}")
    _check_torch_schedule(plan)
    refusal = torch_refusal(
        plan.schedule,
        plan.devices,
        plan.micro_batches,
        len(plan.stages),
        "run it on autopipe's engine (autopipe.pipeline)",
        lambda field, value: f"{field}={value}",  # the API's words: autopipe.plan(..., micro_batches=4)
    )
    if refusal is not None:
        raise PlanError(refusal)  # before the ranks trace and talk: every rank raises it alike
    traced, split = agreed_trace(plan, model, example_inputs, rank, group)
    relays = relay_stages(split, {n.name: i for i, n in enumerate(traced.gm.graph.nodes)})
    _tie_info(relays, split, plan, traced.gm)
    slots = state_slots(model, [(st.index, st.module) for st in split.stages])  # every stage: unused entries too
    for relay in relays:
        relay.slots = tuple(s for s in slots if s.stage == relay.index)
    dev = torch.device(device)
    n = len(relays)
    stages = []
    for relay in relays:
        if plan.stages[relay.index].rank != rank:
            continue
        relay.to(dev)
        stages.append(
            SplitBackwardStage(
                relay,
                relay.index,
                n,
                dev,
                input_args=_examples(traced, relay.carry_in, dev, relay.index > 0),
                output_args=_examples(traced, relay.model_output or relay.carry_out, dev, True),
                group=group,
            )
        )
    loss = (
        None
        if loss_fn is None
        else _structured_loss(
            loss_fn, output_builder(traced.gm, traced.tracer, model, example_inputs), plan.micro_batches, scale_grads
        )
    )
    schedule = _torch_schedule(plan, stages, loss)
    return stages, schedule


def agreed_trace(
    plan: Plan, model: nn.Module, example_inputs: Any, rank: int, group: dist.ProcessGroup | None = None
) -> tuple[TracedModel, Split]:
    """``model`` traced for ``plan`` and split; with a process group, named as rank 0 names it
    and every stage's interface checked alike on the ranks of ``group`` (default: the world),
    which all call it (:func:`~autopipe.stages.agree.agreed_split`)."""
    traced = trace_for_plan(plan, model, example_inputs)
    split = split_model(traced, plan)
    if not dist.is_initialized():
        return traced, split

    def gather(obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, obj, group=group)
        return out

    return agreed_split(plan, traced, split, rank, gather)


def _check_torch_schedule(plan: Plan) -> None:
    """One line if ``plan``'s schedule is none autopipe knows (so neither a torch class nor a CSV runs it)."""
    if plan.schedule not in schedule_names():
        raise PlanError(
            f"schedule {plan.schedule!r} has no torch.distributed.pipelining counterpart; "
            f"plan with one of: {', '.join(schedule_names())}"
        )


def _torch_schedule(plan: Plan, stages: list[Any], loss: Callable[[Any, Any], torch.Tensor] | None) -> Any:
    """The torch schedule that runs ``plan``'s order: the spec's class, or for a schedule torch has
    no class for (``zb-h2``, ``v-half``, ``v-min``) ``_PipelineScheduleRuntime`` loading the plan's
    schedule CSV (:mod:`~autopipe.stages.schedule_csv`) through its own ``_load_csv``."""
    from torch.distributed import pipelining
    from torch.distributed.pipelining import schedules as torch_schedules

    spec = schedule_spec(plan.schedule)
    cls = getattr(pipelining, spec.torch_class) if spec.torch_class else torch_schedules._PipelineScheduleRuntime
    options: dict[str, Any] = {"n_microbatches": plan.micro_batches, "loss_fn": loss}
    signature = inspect.signature(cls if spec.torch_class else torch_schedules.PipelineScheduleMulti)
    if "scale_grads" in signature.parameters:  # torch 2.7 brought the argument and its scaling
        options["scale_grads"] = False  # the loss's gradient is scaled instead (_structured_loss)
    try:
        schedule = cls(stages if spec.torch_multi or not spec.torch_class else stages[0], **options)
        if not spec.torch_class:
            _load_rows(schedule, torch_rows(plan))
    except (ValueError, RuntimeError, AssertionError) as e:
        raise PlanError(
            f"torch's {cls.__name__} rejects this plan ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "plan with another schedule or micro-batch count"
        ) from None
    return schedule


def _load_rows(schedule: Any, rows: list[list[str]]) -> None:
    """``rows`` written as a schedule CSV and read back by ``schedule._load_csv`` (torch's own
    parser, validation and lowering to sends and receives: what a user's CSV goes through)."""
    with tempfile.TemporaryDirectory(prefix="autopipe-csv-") as folder:
        path = Path(folder) / "schedule.csv"
        with path.open("w", newline="", encoding="utf-8") as f:
            csv.writer(f, lineterminator="\n").writerows(rows)
        schedule._load_csv(str(path), format="compute_only")


def _structured_loss(
    loss_fn: Callable[[Any, Any], torch.Tensor], build: Callable[[list[Any]], Any], m: int, scale: bool
) -> Callable[[Any, Any], torch.Tensor]:
    """``loss_fn`` on the model's output as the model returns it, from the last stage's flat one;
    with ``scale``, its gradient (not its value) divided by the ``m`` micro-batches."""

    def loss(output: Any, target: Any) -> torch.Tensor:
        value = loss_fn(build(list(output) if isinstance(output, tuple) else [output]), target)
        return _GradDivided.apply(value, m) if scale and value.requires_grad else value  # type: ignore[no-untyped-call]

    return loss


class _GradDivided(torch.autograd.Function):
    """The identity whose backward divides the gradient by ``m``: a micro-batch's mean loss,
    reported as it is, that trains as ``loss / m`` (autopipe's engine backpropagates that)."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, m: int) -> torch.Tensor:
        ctx.m = m
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad / ctx.m, None


def _examples(
    traced: TracedModel, names: Sequence[str], device: torch.device, requires_grad: bool
) -> tuple[torch.Tensor, ...]:
    """Empty tensors shaped like the values ``names`` (torch's static stage metadata)."""
    out = []
    for n in names:
        info = traced.values[n]
        dtype = getattr(torch, info.dtype)
        t = torch.empty(info.shape, dtype=dtype, device=device)
        out.append(t.requires_grad_(requires_grad) if t.is_floating_point() else t)
    return tuple(out)


def pipeline_inputs(stages: Sequence[Any], batch: Any) -> tuple[torch.Tensor, ...]:
    """``batch`` (the model's inputs: one tensor, a tuple, or a dict of keyword inputs) as the
    first stage takes it -- flat, in the traced graph's input order -- for ``schedule.step``;
    ``()`` on a rank without the first stage (which takes nothing).

        schedule.step(*pipeline_inputs(stages, batch), target=y if stages[-1].is_last else None)
    """
    first = next((s for s in stages if s.is_first), None)
    if first is None:
        return ()
    names: tuple[str, ...] = first.submod.carry_in
    if isinstance(batch, Mapping):
        missing = [n for n in names if n not in batch]
        if missing:
            raise PlanError(
                f"the batch has no input {missing[0]!r} (keys: {', '.join(map(str, batch)) or 'none'}); "
                f"give every input the model was traced with: {', '.join(names)}"
            )
        flat = [batch[n] for n in names]
    else:
        flat = torch.utils._pytree.tree_leaves(list(batch) if isinstance(batch, (tuple, list)) else [batch])
    if len(flat) != len(names) or not all(isinstance(t, torch.Tensor) for t in flat):
        raise PlanError(
            f"the batch has {len(flat)} values where the model was traced with {len(names)} tensor inputs "
            f"({', '.join(names)}); pass the inputs as example_inputs gave them"
        )
    return tuple(flat)


def sync_shared_grads(
    stages: Sequence[Any], group: dist.ProcessGroup | None = None, *, kept: Sequence[torch.Tensor | None] = ()
) -> None:
    """Sum the gradients of tied parameters across the ranks that use them.

    ``stages`` are this rank's PipelineStages from :func:`to_torch_pipelining`. Every rank of
    the pipeline calls this after ``schedule.step`` and before ``optimizer.step``; ranks that do
    not hold a tied parameter add zeros. It sums what ``.grad`` holds, so when gradients
    accumulate over several ``schedule.step`` calls, call it once, after the last of them -- or
    take the earlier gradients out before each step with :func:`take_shared_grads` and pass them
    as ``kept``: they are added back after the sum (``Pipeline.step`` does that).
    """
    relays = [s.submod for s in stages]
    mine = _tied_names(stages)
    old = dict(zip(mine, kept, strict=True)) if kept else {}
    for name, _ranks, shape, dtype in relays[0].tied_ranks:
        p = next((r.tied[name] for r in relays if name in r.tied), None)
        if p is None:
            dist.all_reduce(torch.zeros(shape, dtype=getattr(torch, dtype), device=stages[0].device), group=group)
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
        before = old.get(name)
        if before is not None:
            p.grad = before.add_(p.grad)


def take_shared_grads(stages: Sequence[Any]) -> list[torch.Tensor | None]:
    """The gradients this rank's tied parameters hold (set to None), for ``sync_shared_grads(kept=...)``."""
    taken = []
    for name in _tied_names(stages):
        p = next(s.submod.tied[name] for s in stages if name in s.submod.tied)
        taken.append(p.grad)
        p.grad = None
    return taken


def _tied_names(stages: Sequence[Any]) -> list[str]:
    """The names of the tied parameters this rank's stages hold, each once, in a fixed order."""
    return list(dict.fromkeys(n for s in stages for n in s.submod.tied))


def _tie_info(relays: list[RelayStage], split: Split, plan: Plan, gm: torch.fx.GraphModule) -> None:
    rank_of = {s.index: s.rank for s in plan.stages}
    found: list[tuple[str, tuple[int, ...], tuple[int, ...], str]] = []
    for name, stage_ids in split.shared_params:
        ranks = tuple(sorted({rank_of[s] for s in stage_ids}))
        if len(ranks) < 2:
            continue  # one rank holds every use: its gradient is whole already
        p = gm.get_parameter(name)
        for relay in relays:
            if any(q is p for q in relay.stage.parameters()):
                relay.tied[name] = p
        found.append((name, ranks, tuple(p.shape), str(p.dtype).removeprefix("torch.")))
    for relay in relays:
        relay.tied_ranks = tuple(found)
