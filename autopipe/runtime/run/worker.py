"""One rank of a run: rebuild the model from the plan, make its :class:`Pipeline`, train.

Every rank rebuilds the whole model the same way (``torch.manual_seed(seed)`` right before the
factory, so all ranks hold identical initial weights), re-traces it at the plan's micro-batch
size, checks the trace's fingerprint against the plan's, and hands it to
:class:`~autopipe.runtime.pipeline.Pipeline` -- the same per-rank API a user's own training
loop uses -- with an optimizer made from the run flags. Data: :mod:`autopipe.runtime.run.data`
(``train_data`` when the model file has it, else ``example_inputs``); all ranks draw the same
batches. Ranks run as threads share the global RNG with each other's recomputation (which
sets and restores it), so :func:`~autopipe.runtime.run.local.run_threads` draws the batches
before its threads start and hands them in (``batches``).

Progress: with ``options.progress_file`` rank 0 appends one line per note (``note TEXT``) and
per step (``step K LOSS``) to that file (``autopipe run`` shows them); without, rank 0 prints
the notes to stderr.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from autopipe.errors import RunOptionError, RuntimeFailure
from autopipe.graph.trace import TracedModel
from autopipe.model.load import LoadedModel
from autopipe.plans import Plan
from autopipe.runtime import checkpoint, commit
from autopipe.runtime.actions import plan_schedule, shared_groups
from autopipe.runtime.comm import Comm
from autopipe.runtime.engine import IterationResult
from autopipe.runtime.meters import CudaPeak, PeakMemory, TensorBytes, state_bytes, tensor_bytes_meter
from autopipe.runtime.pipeline import Pipeline
from autopipe.runtime.run.data import Batch, BatchSource
from autopipe.runtime.run.options import RunOptions
from autopipe.runtime.run.resume import optimizer_flags, resume_note
from autopipe.stages.rebuild import rebuild_model, trace_for_plan

__all__ = ["Batch", "RankResult", "Rebuilt", "plan_schedule", "rebuild", "shared_groups", "train_rank"]


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
    peak_tensor_bytes: int  # live tensor bytes at their peak over step ``tensor_step`` (graph/live_bytes.py)
    tensor_step: int  # the step counted (an index into ``iterations``); its times are slowed by counting
    steps_done: int  # including those of a resumed checkpoint
    engine: str = "autopipe"  # "autopipe" or "torch"
    data: str = "example_inputs"  # "train_data" or "example_inputs"


def rebuild(plan: Plan, seed: int = 0, base: str | None = None) -> Rebuilt:
    """Build and trace the plan's model; PlanError when it no longer matches the plan.

    A relative model file is looked for from the working directory, then from ``base``.
    """
    loaded = rebuild_model(plan, seed=seed, base=base)
    loaded.model.train()
    inputs = loaded.make_inputs(plan.micro_batch_size)
    return Rebuilt(loaded, trace_for_plan(plan, loaded.model, inputs, source=loaded.spec.path))


def optimizer_class(options: RunOptions) -> type[torch.optim.Optimizer]:
    cls = getattr(torch.optim, options.optimizer, None)
    if cls is None or not isinstance(cls, type) or not issubclass(cls, torch.optim.Optimizer):
        raise RuntimeFailure(
            f"unknown optimizer {options.optimizer!r}; name a torch.optim class such as SGD, Adam or AdamW"
        )
    return cls


# Fused kernels step in place: the for-loop Adam makes two temporaries the size of each parameter
# (the step's peak, on a model whose parameters outweigh its activations), which the planner's
# four bytes per parameter byte (weights, gradients, two moments) do not count.
_FUSED = ("Adam", "AdamW")


def make_optimizer(params: list[torch.nn.Parameter], options: RunOptions) -> torch.optim.Optimizer:
    """The run's optimizer; Adam and AdamW fused unless ``--optimizer-arg`` says foreach or fused."""
    cls = optimizer_class(options)
    extra: dict[str, Any] = dict(options.optimizer_kwargs)
    if options.optimizer in _FUSED and not {"fused", "foreach"} & set(extra) and params:
        extra["fused"] = True
    opt: torch.optim.Optimizer = cls(params, lr=options.lr, **extra)  # type: ignore[call-arg]
    return opt


def train_rank(
    plan: Plan,
    rank: int,
    comm_factory: Callable[[list[tuple[int, ...]]], Comm],
    options: RunOptions,
    rebuilt: Rebuilt | None = None,
    batches: Callable[[int], Batch] | None = None,
    process_memory: bool = True,
) -> RankResult:
    """Run ``options.steps`` optimizer steps of ``plan`` as ``rank``.

    ``batches(k)`` gives step ``k``'s batch; by default the rank draws it (:mod:`~autopipe.runtime.run.data`).
    ``process_memory``: measure the process's peak memory on the CPU (False for thread ranks,
    which share one process: their memory is counted as the planner counts it).
    """
    if options.engine == "torch" and (options.save_checkpoint or options.resume):
        raise RunOptionError(
            "--save-checkpoint and --resume work with --engine autopipe only; drop them or the --engine flag"
        )
    optimizer_class(options)
    rb = rebuilt if rebuilt is not None else rebuild(plan, options.seed, options.model_base)
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if options.device == "cuda" else torch.device("cpu")
    progress = _progress(rank, options.progress_file)
    source = BatchSource(rb.loaded, plan.batch_size, options.seed, progress("note")) if batches is None else None
    pipe = Pipeline(
        plan,
        rb.loaded.model,
        rank=rank,
        example_inputs=rb.loaded.make_inputs(plan.micro_batch_size),
        loss_fn=rb.loaded.loss_fn,
        device=device,
        engine=options.engine,
        comm=comm_factory if options.engine == "autopipe" else None,
        timeout_s=options.timeout_s,
        traced=rb.traced,
    )
    params = list(pipe.parameters())
    optimizer = make_optimizer(params, options)
    done = 0
    if options.resume:
        done = checkpoint.load_rank(options.resume, rank, pipe, optimizer, plan.recipe.fingerprint)
        note = resume_note(checkpoint.read_meta(options.resume)["optimizer"], options)
        if note:
            progress("note")(note)
    pipe.steps = done
    meter = PeakMemory(device)
    meter.start()
    draw = batches if batches is not None else source.batch  # type: ignore[union-attr]
    iterations, tensors = _train(pipe, optimizer, range(done, done + options.steps), draw, progress("step"))
    static = state_bytes(params, optimizer)
    peak, kind = _peak(meter, params, static, iterations, process_memory or device.type == "cuda")
    if options.save_checkpoint:
        meta = {
            "fingerprint": plan.recipe.fingerprint,
            "step": done + options.steps,
            "stages": len(plan.stages),
            "optimizer": optimizer_flags(options),
        }
        commit.save(options.save_checkpoint, rank, pipe.comm, pipe.stage_state_dicts(), optimizer, meta)
    data = source.kind if source is not None else ("train_data" if rb.loaded.make_train_data else "example_inputs")
    return RankResult(
        rank,
        tuple(st.index for st in pipe.stages) if pipe.stages else tuple(s.index for s in plan.stages if s.rank == rank),
        tuple(iterations),
        static,
        peak,
        kind,
        peak_tensor_bytes=tensors,
        tensor_step=tensor_step(options.steps),
        steps_done=done + options.steps,
        engine=options.engine,
        data=data,
    )


def _train(
    pipe: Pipeline,
    optimizer: torch.optim.Optimizer,
    steps: range,
    draw: Callable[[int], Batch],
    say: Callable[[str], None],
) -> tuple[list[IterationResult], int]:
    """Train ``steps``; their measurements and the peak live tensor bytes of the step counted
    (:func:`tensor_step`: counted as they are held before it, the batch not counted)."""
    iterations, counted, peak = [], tensor_step(len(steps)), 0
    for n, k in enumerate(steps):
        inputs, targets = draw(k)
        guard: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        meter: TensorBytes | CudaPeak | None = None
        if n == counted:
            held = [*pipe.tensors(), *optimizer_tensors(optimizer)]
            guard = meter = tensor_bytes_meter(pipe.device, held, ignore=_leaves((inputs, targets)))
        with guard:
            loss = pipe.step(inputs, targets)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if meter is not None:
            peak = meter.peak
        it = pipe.last
        assert it is not None
        iterations.append(replace(it, step_s=time.perf_counter() - it.start_time))
        say(f"{k} {loss!r}")
    return iterations, peak


def tensor_step(steps: int) -> int:
    """The step whose live tensor bytes a run counts: the second (the optimizer's state made by
    the first, as in every later step), or the only one."""
    return 1 if steps > 1 else 0


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors of the optimizer's state (Adam's moments, its step counters)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _leaves(value: object) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _peak(
    meter: PeakMemory, params: list[torch.nn.Parameter], static: int, iterations: list[IterationResult], measured: bool
) -> tuple[int, str]:
    """The rank's peak memory and how it was found: measured for a process of its own (or on a
    GPU); counted as the planner counts it for thread ranks, which share one process."""
    if measured:
        return meter.stop(sum(p.numel() * p.element_size() for p in params))
    peak = static + max((it.peak_activation_bytes for it in iterations), default=0)
    return peak, (
        "cpu count (thread ranks share one process): parameters + gradients + optimizer state + peak saved activations"
    )


def _progress(rank: int, path: str | None) -> Callable[[str], Callable[[str], None]]:
    """``progress(kind)(text)``: rank 0's notes and steps, to ``path`` (one line each) or stderr."""

    def sink(kind: str) -> Callable[[str], None]:
        def say(text: str) -> None:
            if rank != 0:
                return
            if path is not None:
                with open(path, "a") as f:
                    f.write(json.dumps([kind, text]) + "\n")
            elif kind == "note":
                print(f"autopipe: {text}", file=sys.stderr, flush=True)

        return say

    return sink
