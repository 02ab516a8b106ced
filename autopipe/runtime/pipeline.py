"""Your own training loop over a plan: this rank's part of the pipeline, stepped with your batches.

    # train.py -- run with: torchrun --nproc-per-node 2 train.py
    plan = autopipe.Plan.load("plan.json")
    model = build_model()                       # the plan's model, built the same on every rank
    pipe = autopipe.pipeline(plan, model, example_inputs=x[: plan.micro_batch_size], loss_fn=loss_fn)
    opt = torch.optim.AdamW(pipe.parameters(), lr=3e-4)     # any optimizer: it is yours
    for inputs, targets in loader:              # batches of plan.batch_size samples
        loss = pipe.step(inputs, targets)       # forward + backward of the m micro-batches
        opt.step()
        opt.zero_grad()
    torch.save(pipe.state_dict(), f"rank{pipe.rank}.pt")    # this rank's part of model.state_dict()

:class:`Pipeline` traces ``model`` as the plan was traced, checks the fingerprint, splits it
and keeps the stages of its rank (their parameters are ``model``'s own, moved to ``device``).
Each rank traces on its own, and values cross ranks by their node's name: at the first step,
before anything is sent, the ranks agree on the names (rank 0's; a trace that met the same ops
in another order, as code looping over a set of strings does under another ``PYTHONHASHSEED``,
is renamed to them) and compare every stage's interface, or fail alike in one line
(:mod:`autopipe.stages.agree`).
:meth:`Pipeline.step` cuts the batch into the plan's micro-batches, runs the forward and
backward of all of them (gradients accumulate in ``.grad``, tied weights summed across the
ranks that hold them) and returns the batch's mean loss -- on every rank: the last rank's
value is broadcast, so every rank can log it or stop on it. The optimizer step and
``zero_grad`` are the caller's. Ranks whose stages read the model's inputs (always the first)
need ``inputs``, the last rank needs ``targets``; the others may pass ``None`` (passing the
batch everywhere is simplest and costs nothing).

State: :meth:`Pipeline.state_dict` is this rank's part of ``model.state_dict()`` -- its keys
(persistent buffers, no non-persistent ones, no tracer constants; a tied weight under all of its
names; an entry no stage uses on the one rank that keeps it), the rank's live tensors -- so the
union over the ranks loads into a fresh model with ``strict=True``.
:meth:`Pipeline.load_state_dict` takes the whole model's ``state_dict()`` (or a rank's own) on
every rank and loads what the rank holds. Who holds what: :mod:`autopipe.runtime.checkpoint`.

Process group: under torchrun the group is the user's when ``torch.distributed`` is
initialised already; otherwise :class:`Pipeline` initialises it (``gloo`` on the CPU,
``nccl`` on CUDA) from torchrun's environment. The pipeline uses the whole world: its size
must be the plan's device count.

Engines: ``"autopipe"`` (the built-in executor: any plan, every schedule, recomputation)
or ``"torch"`` (``torch.distributed.pipelining`` through
:func:`~autopipe.stages.export.to_torch_pipelining`); both give the same losses and weights.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autopipe.errors import PlanError, PlanFileError, RuntimeFailure
from autopipe.graph.outputs import output_builder
from autopipe.graph.trace import TracedModel
from autopipe.plans import Plan
from autopipe.runtime.actions import action_seconds, plan_schedule, shared_groups
from autopipe.runtime.comm import Comm, DistComm
from autopipe.runtime.engine import IterationResult, PipelineEngine
from autopipe.runtime.microbatch import check_inputs, flat_inputs, input_specs, split_batch, split_flat
from autopipe.runtime.order import message_order
from autopipe.runtime.routing import make_routing
from autopipe.runtime.shapes import value_specs
from autopipe.stages.agree import agreed_split
from autopipe.stages.rebuild import rebuild_model, trace_for_plan
from autopipe.stages.split import Split, StageModule, split_model
from autopipe.stages.state import Slot, slot_tensor, state_slots
from autopipe.units import check_kind, check_path

__all__ = ["ENGINES", "CommFactory", "Pipeline", "pipeline"]

ENGINES = ("autopipe", "torch")
CommFactory = Callable[[list[tuple[int, ...]]], Comm]  # tied-weight rank groups -> this rank's Comm


def pipeline(
    plan: Plan | str | Path,
    model: nn.Module,
    *,
    rank: int | None = None,
    example_inputs: Any = None,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    device: str | torch.device | None = None,
    engine: str = "autopipe",
    comm: CommFactory | None = None,
    timeout_s: float = 60.0,
) -> Pipeline:
    """This rank's :class:`Pipeline` of ``plan`` over ``model`` (see the module docstring).

    ``plan``: a Plan or the path of its JSON. ``rank``: default ``torch.distributed``'s rank,
    else ``$RANK``. ``example_inputs``: one micro-batch (``plan.micro_batch_size`` samples) of
    the model's inputs, to trace with; default the plan's model file's ``example_inputs``.
    ``loss_fn(output, targets)``: a mean loss; default the plan's model file's ``loss_fn``
    (the output's mean when it has none). ``device``: default ``cuda:$LOCAL_RANK`` when CUDA is
    available, else the CPU. ``comm``: for tests, a factory of the autopipe engine's
    communicator (threads instead of processes); ``timeout_s``: every send, receive and
    collective.
    """
    if not isinstance(plan, Plan):
        check_path(plan, "plan", "a Plan or the path of its JSON", error=PlanFileError)
    check_kind(model, nn.Module, "model", "the nn.Module the plan was made for (built the same on every rank)")
    return Pipeline(
        plan if isinstance(plan, Plan) else Plan.load(plan),
        model,
        rank=rank,
        example_inputs=example_inputs,
        loss_fn=loss_fn,
        device=device,
        engine=engine,
        comm=comm,
        timeout_s=timeout_s,
    )


def executor_refusal(plan: Plan) -> str | None:
    """Why autopipe's executor does not run ``plan`` as priced, in one line (None: it does). It
    recomputes whole stages; a plan's uniform memory choice (``Plan.memory_choice``: Megatron-LM's
    selective recomputation, block method or activation offload) is for Megatron-LM to run."""
    if not plan.memory_choice:
        return None
    field = (
        "recompute_modules"
        if plan.recompute_modules
        else "recompute_layers"
        if plan.recompute_layers
        else "offload_modules"
    )
    flag = "--" + field.replace("_", "-") + (" 0" if field == "recompute_layers" else " none")
    return (
        f"the plan makes a uniform memory choice ({plan.memory_choice}: {field}), which autopipe's executor "
        f"does not run (it recomputes whole stages); plan again with {flag} to run it here, or run it with "
        "Megatron-LM (autopipe config PLAN --for megatron)"
    )


class Pipeline:
    """One rank's stages of a plan: :meth:`parameters` for the optimizer, :meth:`step` per batch."""

    def __init__(
        self,
        plan: Plan,
        model: nn.Module,
        *,
        rank: int | None = None,
        example_inputs: Any = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        device: str | torch.device | None = None,
        engine: str = "autopipe",
        comm: CommFactory | None = None,
        timeout_s: float = 60.0,
        traced: TracedModel | None = None,
    ) -> None:
        """``traced``: ``model`` traced for the plan already (:func:`trace_for_plan`), reused."""
        if engine not in ENGINES:
            raise RuntimeFailure(f"unknown engine {engine!r}; use one of: {', '.join(ENGINES)}")
        if engine == "torch" and comm is not None:
            raise RuntimeFailure(
                "the torch engine runs on torch.distributed processes; comm= serves the autopipe engine only"
            )
        refusal = executor_refusal(plan)
        if refusal is not None:
            raise PlanError(refusal)
        self.plan, self.engine_name = plan, engine
        self.device = _device(device)
        if example_inputs is None or loss_fn is None:
            example_inputs, loss_fn = _from_model_file(plan, example_inputs, loss_fn)
        _check_leading(
            example_inputs, plan.micro_batch_size, "example_inputs", "pass one micro-batch, x[: plan.micro_batch_size]"
        )
        if comm is None:
            _init_process_group(plan, self.device, timeout_s)
        self.rank = _rank(rank, plan)
        self.loss_fn = loss_fn
        self._model = model
        self.steps = 0  # batches stepped
        self.last: IterationResult | None = None  # the last step's measurements
        if engine == "torch":
            self._init_torch(example_inputs)
        else:
            self._init_autopipe(example_inputs, traced, comm, timeout_s)
        self._input_specs = input_specs(self._names, example_inputs) if self.needs_inputs else ()

    # ------------------------------------------------------------------ building

    def _init_autopipe(
        self, example: Any, traced: TracedModel | None, comm: CommFactory | None, timeout_s: float
    ) -> None:
        plan = self.plan
        if traced is None:
            traced = trace_for_plan(plan, self._model, example)
        split = split_model(traced, plan)
        groups = shared_groups(split)  # by parameter and stage: the same whatever the nodes are named
        self.comm = comm([g for _, g in groups]) if comm is not None else DistComm(timeout_s, [g for _, g in groups])
        self._build(traced, split, example)
        # Checked with the other ranks at the first step (a collective: ranks may be built one by one).
        self._unagreed: tuple[TracedModel, Split, Any] | None = (traced, split, example)

    def _build(self, traced: TracedModel, split: Split, example: Any) -> None:
        plan = self.plan
        schedule = plan_schedule(plan)
        groups = shared_groups(split)
        self._names = [str(n.target) for n in traced.gm.graph.nodes if n.op == "placeholder"]
        specs = value_specs(traced.gm, flat_inputs(self._names, example))
        self.stages: list[StageModule] = [st for st in split.stages if st.rank == self.rank]
        self._slots = _mine(state_slots(self._model, [(st.index, st.module) for st in split.stages]), self.stages)
        for st in self.stages:
            st.module.to(self.device)
        by_name = dict(traced.gm.named_parameters())
        routing = make_routing(split, plan.devices, plan.micro_batches)
        order = message_order(schedule, routing, specs, action_seconds(plan))
        self._engine = PipelineEngine(
            self.stages,
            schedule[self.rank],
            routing,
            specs,
            self.comm,
            order=order[self.rank],
            input_names=split.input_names,
            output_names=split.output_names,
            make_output=output_builder(traced.gm, traced.tracer, self._model, example),
            loss_fn=self.loss_fn,
            shared=[(by_name[n], g) for n, g in groups if self.rank in g],
            recompute=[s.index for s in plan.stages if s.recompute],
            last_stage=split.last.index,
            device=self.device,
        )
        reads = {n for st in self.stages for n in st.inputs} | (
            set(split.output_names) if split.last.rank == self.rank else set()
        )
        self.needs_inputs = any(n in reads for n in split.input_names)
        self.is_last = split.last.rank == self.rank
        self._modules: list[nn.Module] = [st.module for st in self.stages]

    def _agree(self) -> None:
        """Every rank's stages named and cut alike (:func:`~autopipe.stages.agree.agreed_split`):
        rebuilt when this rank's trace was renamed to rank 0's; one line on every rank if not."""
        if self._unagreed is None:
            return
        traced, split, example = self._unagreed
        self._unagreed = None
        agreed, resplit = agreed_split(self.plan, traced, split, self.rank, self.comm.all_gather_object)
        if resplit is not split:  # the same parameters (the model's own), other node names
            # Buffers moved to the device are the old stages' copies (weights loaded since included).
            kept = {st.index: (st.module.training, st.module.state_dict()) for st in self.stages}
            self._build(agreed, resplit, example)
            for st in self.stages:
                training, state = kept[st.index]
                st.module.load_state_dict(state)
                st.module.train(training)

    def _init_torch(self, example: Any) -> None:
        from autopipe.stages.export import sync_shared_grads, to_torch_pipelining

        self._sync = sync_shared_grads
        self._torch_stages, self._schedule = to_torch_pipelining(
            self.plan, self._model, self.rank, example_inputs=example, device=self.device, loss_fn=self.loss_fn
        )
        self.stages = []
        first = [s.submod for s in self._torch_stages if s.is_first]
        self._names = [str(n) for n in getattr(first[0], "carry_in", ())] if first else []
        self.needs_inputs = any(s.is_first for s in self._torch_stages)
        self.is_last = any(s.is_last for s in self._torch_stages)
        self._modules = [getattr(s.submod, "stage", s.submod) for s in self._torch_stages]
        order = {k: i for i, k in enumerate(self._model.state_dict(keep_vars=True))}
        held = [slot for s in self._torch_stages for slot in getattr(s.submod, "slots", ())]
        self._slots = tuple(sorted(held, key=lambda slot: (order[slot.keys[0]], slot.stage)))

    # ------------------------------------------------------------------ the user's loop

    def parameters(self) -> Iterator[nn.Parameter]:
        """The trainable parameters of this rank's stages, each once (hand them to an optimizer)."""
        seen = dict.fromkeys(p for m in self._modules for p in m.parameters() if p.requires_grad)
        return iter(list(seen))

    def tensors(self) -> list[torch.Tensor]:
        """Every parameter and buffer of this rank's stages and every gradient they hold, each
        once: what the rank keeps between steps besides its optimizer's state."""
        held = dict.fromkeys(t for m in self._modules for t in [*m.parameters(), *m.buffers()])
        grads = [p.grad for p in held if isinstance(p, nn.Parameter) and p.grad is not None]
        return [*held, *grads]

    def step(self, inputs: Any = None, targets: Any = None) -> float:
        """Forward and backward of one batch (``plan.batch_size`` samples); its mean loss.

        ``inputs`` as the model takes them (a Tensor, a tuple of positional inputs or a dict of
        keyword inputs). Gradients accumulate in the parameters' ``.grad``; step and zero
        them with your optimizer.
        """
        plan = self.plan
        B, m = plan.batch_size, plan.micro_batches
        if inputs is None and self.needs_inputs:
            raise RuntimeFailure(
                f"rank {self.rank} runs stages that read the model's inputs; pass the batch to step() on this rank"
            )
        if inputs is not None and self._input_specs:
            check_inputs(self._input_specs, self._names, inputs, B, f"step {self.steps}'s inputs")
        flat = [_to(v, self.device) for v in flat_inputs(self._names, inputs)] if inputs is not None else None
        if flat is not None:
            _check_leading(
                flat,
                B,
                f"step {self.steps}'s inputs",
                f"give batches of plan.batch_size = {B} samples (drop the last incomplete one)",
            )
        if targets is not None:
            _check_leading(targets, B, f"step {self.steps}'s targets", f"give targets of plan.batch_size = {B} samples")
        targets = _to(targets, self.device)
        if self.engine_name == "torch":
            it = self._torch_step(flat, targets)
        else:
            self._agree()  # before anything is sent
            mbs = split_flat(flat, B, m) if flat is not None else [[None] * len(self._names) for _ in range(m)]
            it = self._engine.forward_backward(mbs, split_batch(targets, B, m), self.steps)
        loss = self._broadcast(it.loss)
        self.last = IterationResult(loss, it.records, it.start_time, it.makespan_s, it.step_s, it.peak_activation_bytes)
        self.steps += 1
        return loss

    def _torch_step(self, flat: list[Any] | None, targets: Any) -> IterationResult:
        from autopipe.stages.export import take_shared_grads

        losses: list[torch.Tensor] = []
        start = time.perf_counter()
        args = flat if self.needs_inputs and flat is not None else []
        extra: dict[str, Any] = {"target": targets, "losses": losses} if self.is_last else {}
        kept = take_shared_grads(self._torch_stages)  # earlier steps' gradients: summed across ranks already
        self._schedule.step(*args, **extra)
        self._sync(self._torch_stages, kept=kept)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        loss = float(torch.stack([x.detach().float() for x in losses]).mean()) if losses else None
        span = time.perf_counter() - start
        return IterationResult(loss, (), start, span, span, 0)

    def _broadcast(self, loss: float | None) -> float:
        """The last rank's loss on every rank (a sum with zeros elsewhere: exact)."""
        t = torch.tensor([0.0 if loss is None else loss], dtype=torch.float64, device=self.device)
        if self.engine_name == "torch":
            import torch.distributed as dist

            dist.all_reduce(t)
        else:
            self.comm.all_reduce_sum([t], tuple(range(self.plan.devices)))
        return float(t[0])

    # ------------------------------------------------------------------ modes and checkpoints

    def train(self, mode: bool = True) -> Pipeline:
        for mod in self._modules:
            mod.train(mode)
        return self

    def eval(self) -> Pipeline:
        return self.train(False)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's part of the model's ``state_dict``: its keys, the model's order, the rank's
        live tensors (detached; trained in place). The union over the ranks is exactly the
        model's ``state_dict()`` -- loadable with ``strict=True`` -- see :meth:`stage_state_dicts`."""
        out: dict[str, torch.Tensor] = {}
        for part in self.stage_state_dicts().values():
            for k, t in part.items():
                out.setdefault(k, t)
        order = {k: i for i, s in enumerate(self._slots) for k in s.keys}
        return dict(sorted(out.items(), key=lambda kv: order[kv[0]]))

    def stage_state_dicts(self) -> dict[int, dict[str, torch.Tensor]]:
        """This rank's part of the model's ``state_dict``, per stage index (a checkpoint's stage
        files): each entry a stage holds, under the model's names (a tied weight under all of
        them, in every stage that uses it); persistent buffers, not the non-persistent ones nor
        tracer constants; an entry no stage uses kept by one stage (see
        :mod:`autopipe.runtime.checkpoint` for which)."""
        torch_stages = getattr(self, "_torch_stages", [])
        out: dict[int, dict[str, torch.Tensor]] = {  # every stage of the rank, holding state or not
            i: {} for i in [st.index for st in self.stages] or [s.stage_index for s in torch_stages]
        }
        for slot in self._slots:
            t = slot_tensor(slot).detach()
            out.setdefault(slot.stage, {}).update(dict.fromkeys(slot.keys, t))
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor], *, stages: Sequence[int] | None = None) -> None:
        """Load this rank's part of ``state``: the whole model's ``state_dict()`` or a rank's own
        :meth:`state_dict` (on every rank; each takes what it holds). ``stages``: load only these
        stage indices' part (a checkpoint's stage file holds one stage's). A key that is not the
        model's, a missing key this rank needs or a tensor of another shape: one line naming it."""
        known = self._model.state_dict(keep_vars=True).keys()
        foreign = [k for k in state if k not in known]
        if foreign:
            raise RuntimeFailure(
                f"the state has {foreign[0]} (and {len(foreign) - 1} more), which is not in the model's "
                "state_dict; load the model's own state_dict() or a rank's pipe.state_dict()"
            )
        slots = [s for s in self._slots if stages is None or s.stage in stages]
        missing = [s.keys[0] for s in slots if not any(k in state for k in s.keys)]
        if missing:
            raise RuntimeFailure(
                f"the state has no {missing[0]} (and {len(missing) - 1} more) for rank {self.rank}'s stages; "
                "load this rank's own state_dict() or the whole model's"
            )
        pairs = []
        for slot in slots:  # every entry checked before any is copied: never half-loaded
            key = next(k for k in slot.keys if k in state)
            target, value = slot_tensor(slot), state[key]
            if not isinstance(value, torch.Tensor) or value.shape != target.shape:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise RuntimeFailure(
                    f"the state's {key} is {got}, the model's is {tuple(target.shape)}; "
                    "load a state_dict of the model this plan was made for"
                )
            pairs.append((target, value))
        with torch.no_grad():
            for target, value in pairs:
                target.copy_(value)


# ---------------------------------------------------------------------- helpers


def _mine(slots: tuple[Slot, ...], stages: list[StageModule]) -> tuple[Slot, ...]:
    """The slots of ``stages`` (this rank's)."""
    indices = {st.index for st in stages}
    return tuple(s for s in slots if s.stage in indices)


def _device(device: str | torch.device | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    return torch.device("cpu")


def _rank(rank: int | None, plan: Plan) -> int:
    if rank is None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "-1"))
    if not 0 <= rank < plan.devices:
        got = "no rank (run under torchrun, or pass rank=)" if rank == -1 else f"rank {rank}"
        raise RuntimeFailure(f"{got}: the plan has ranks 0 to {plan.devices - 1}")
    return rank


def _init_process_group(plan: Plan, device: torch.device, timeout_s: float) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise RuntimeFailure(
                "no process group and no torchrun environment; start with torchrun --nproc-per-node N train.py"
            )
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s))
    if dist.get_world_size() != plan.devices:
        raise RuntimeFailure(
            f"the plan needs {plan.devices} ranks but the process group has {dist.get_world_size()}; "
            f"start {plan.devices} processes"
        )


def _from_model_file(plan: Plan, inputs: Any, loss_fn: Any) -> tuple[Any, Callable[[Any, Any], torch.Tensor]]:
    """What was not given, from the plan's model file (built aside; the caller's RNG untouched)."""
    if not plan.recipe.model_file:
        raise PlanError("the plan names no model file; pass example_inputs= and loss_fn= to autopipe.pipeline")
    with torch.random.fork_rng(devices=[]):
        loaded = rebuild_model(plan, meta=inputs is not None)
        if inputs is None:
            inputs = loaded.make_inputs(plan.micro_batch_size)
    return inputs, loss_fn if loss_fn is not None else loaded.loss_fn


def _check_leading(value: Any, size: int, what: str, fix: str) -> None:
    """The first tensor (of a batch dimension) in ``value`` has ``size`` rows, or one line why not."""
    leaves = [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor) and t.dim() > 0]
    if leaves and leaves[0].shape[0] != size:
        raise RuntimeFailure(f"{what} have {leaves[0].shape[0]} samples (leading dimension), not {size}; {fix}")


def _to(x: Any, device: torch.device) -> Any:
    return torch.utils._pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x)
