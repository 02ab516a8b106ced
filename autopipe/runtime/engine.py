"""The pipeline engine: one rank runs its action list for one training iteration.

For each action of the rank's list (``autopipe.schedules``), in order::

    F(j, i)  inputs of stage j for micro-batch i (model inputs, received or local activations,
             received ones as fresh autograd leaves) -> stage module -> send each output to
             every stage that reads it; the last stage computes loss_fn(output, targets) / m
    B(j, i)  gradients of j's outputs (summed over the stages that read them; the loss on
             the last stage) -> backward -> send the gradient of every received input back
             to its producer.  Full backward (inputs and parameters) when the schedule has no
             W; with W (zero-bubble, Qi et al. 2023) only the input gradients, keeping the
             gradients that flow into the weight-gradient part of the graph for ...
    W(j, i)  ... the parameter gradients, restarted from those kept gradients: W runs only
             the weight-gradient kernels (``autopipe.graph.split_backward``). A recomputed
             stage's B is whole (one recomputation) and its W does nothing.

Gradients accumulate in ``.grad`` over the m micro-batches (each loss scaled by 1/m: the mean
over equal micro-batches is the batch mean), then parameters used by stages on several ranks
(tied embeddings) get their gradients summed over those ranks — each holds a copy updated
identically, the same as one shared parameter. Only the iteration's own gradients are summed
(what earlier iterations left in ``.grad`` is summed already and added back after), so
gradients accumulated over several iterations are the unsplit model's. The optimizer is the caller's: it steps
after :meth:`PipelineEngine.forward_backward` (``autopipe.pipeline`` leaves that to the user).

Sends and receives between two ranks are posted in one order both agree on
(``autopipe.runtime.order``: NCCL matches them by position, not tag); receives as early as
that order allows, sends as soon as their tensor is made; a send that has finished is let go
after each action (its tensor need not outlive it), the others are waited on at the end of the
iteration: transfers overlap compute. Stages marked for recomputation run
under ``torch.utils.checkpoint`` (non-reentrant); buffers it would update twice (batch-norm
running statistics) are restored after the recomputation, so numbers equal a plain run.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from autopipe.errors import RuntimeFailure
from autopipe.graph.split_backward import WeightGrad, backward_input
from autopipe.runtime.comm import Comm, Work
from autopipe.runtime.meters import ActionTimer, SavedBytes
from autopipe.runtime.order import SEND, MessageKey
from autopipe.runtime.routing import BACKWARD, FORWARD, Routing
from autopipe.runtime.shapes import TensorSpec
from autopipe.schedules import Action
from autopipe.stages.split import OUTPUT, StageModule

__all__ = ["ActionRecord", "IterationResult", "PipelineEngine"]


@dataclass(frozen=True)
class ActionRecord:
    """One action as it ran: seconds from the rank's iteration start.

    ``ready_s``: when the messages it needed had arrived (its start when it needed none);
    the time before that is spent waiting, after it computing (and posting its sends).
    ``send_s``: of the time after, what handing its messages to another rank took (copying
    them out, posting them to the transport; the run report counts it under messages).
    """

    action: str  # "1F0"
    start_s: float
    ready_s: float
    end_s: float
    send_s: float = 0.0

    @property
    def wait_s(self) -> float:
        return self.ready_s - self.start_s

    @property
    def compute_s(self) -> float:
        return self.end_s - self.ready_s


@dataclass(frozen=True)
class IterationResult:
    loss: float | None  # the batch loss, on the rank of the last stage
    records: tuple[ActionRecord, ...]
    start_time: float  # absolute time.perf_counter() of the iteration start
    makespan_s: float  # end of the rank's last action
    step_s: float  # the whole iteration: actions, gradient sync (and the optimizer step in a run)
    peak_activation_bytes: int  # saved-for-backward bytes held at once (CPU count)


@dataclass
class _Saved:
    leaves: dict[str, torch.Tensor]  # received inputs that need a gradient
    outputs: dict[str, torch.Tensor]  # outputs that need a gradient
    loss: torch.Tensor | None
    roots: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor | None] = field(default_factory=list)
    weight: WeightGrad | None = None  # W's half of a split backward


class _RestoreBuffers:
    """Put the module's buffers back after recomputation (running stats update once)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self) -> None:
        self.saved = [(b, b.detach().clone()) for b in self.module.buffers()]

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for b, v in self.saved:
                b.copy_(v)


def _recompute_contexts(
    module: torch.nn.Module,
) -> tuple[contextlib.AbstractContextManager[None], _RestoreBuffers]:
    return contextlib.nullcontext(), _RestoreBuffers(module)


class PipelineEngine:
    """Runs one rank's stages; :meth:`forward_backward` is one batch's forward and backward."""

    def __init__(
        self,
        stages: Sequence[StageModule],
        actions: Sequence[Action | None],
        routing: Routing,
        specs: Mapping[str, TensorSpec],
        comm: Comm,
        *,
        input_names: Sequence[str],
        output_names: Sequence[str | None],
        make_output: Callable[[list[Any]], object],
        loss_fn: Callable[[object, object], torch.Tensor],
        order: Mapping[int, Sequence[tuple[int, MessageKey]]],
        shared: Sequence[tuple[torch.nn.Parameter, tuple[int, ...]]] = (),
        recompute: Sequence[int] = (),
        last_stage: int,
        device: torch.device | None = None,
    ) -> None:
        self.stages = {s.index: s for s in stages}
        self.actions = [a for a in actions if a is not None]
        self.routing, self.specs, self.comm = routing, specs, comm
        self.order = dict(order)  # peer -> (SEND or RECV, message), in the agreed order
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.make_output, self.loss_fn = make_output, loss_fn
        self.shared = tuple(shared)
        self.recompute = set(recompute)
        self.last = last_stage
        self.device = device or torch.device("cpu")
        self.split_backward = any(a.kind == "W" for a in self.actions)
        self.timer = ActionTimer(self.device)
        params = {id(p): p for s in stages for p in s.module.parameters()}
        self.params: dict[int, list[torch.nn.Parameter]] = {
            s.index: [p for p in dict.fromkeys(s.module.parameters()) if p.requires_grad] for s in stages
        }
        self.saved_bytes = SavedBytes({p.untyped_storage().data_ptr() for p in params.values()})
        self.stage_saved: dict[int, int] = {}  # stage -> saved-for-backward bytes of one F

    # ------------------------------------------------------------------ one iteration

    def forward_backward(
        self, inputs: Sequence[Sequence[Any]], targets: Sequence[object], step: int
    ) -> IterationResult:
        """Run the rank's actions on micro-batches ``inputs`` (flat, graph order): gradients
        accumulate in ``.grad`` (tied ones summed across ranks); nothing is stepped or zeroed."""
        self.step = step
        kept = [p.grad for p, _ in self.shared]  # earlier steps' gradients: summed across ranks already
        for p, _ in self.shared:
            p.grad = None
        self.mb_inputs = [dict(zip(self.input_names, mb, strict=True)) for mb in inputs]
        self.mb_targets = list(targets)
        self.m = len(self.mb_inputs)
        self.posted: dict[MessageKey, tuple[torch.Tensor, Work, int]] = {}  # buffer, work, place in the order
        self.made: dict[MessageKey, torch.Tensor] = {}  # sends waiting for their turn
        self.cursor: dict[int, int] = {}  # peer -> operations posted
        self.local: dict[tuple[Any, ...], torch.Tensor] = {}
        self.sends: list[tuple[Work, torch.Tensor, int, int]] = []  # work, tensor, peer, place in the order
        self.heard: dict[int, int] = {}  # peer -> the latest place in the order of a receive completed
        self.saved: dict[tuple[int, int], _Saved] = {}
        self.held: dict[tuple[int, int], int] = {}
        self.peak_held = 0
        self.loss_total: torch.Tensor | None = None
        self.comm.barrier()
        start = self.timer.reset()
        for peer in self.order:
            self._pump(peer)
        for a in self.actions:
            with self.timer.time(a):
                getattr(self, f"_{a.kind.lower()}")(a.stage, a.microbatch)
            self._let_go()
        for peer in self.order:
            self._pump(peer)
        if self.made or self.posted:
            raise RuntimeFailure(
                f"internal error: rank {self.comm.rank} ended the iteration with messages "
                f"not sent or not read ({sorted(self.made)[:3]}, {sorted(self.posted)[:3]})"
            )
        for work, *_ in self.sends:
            work.wait()
        records = tuple(ActionRecord(str(a), s, r, e, p) for a, s, r, e, p in self.timer.results())
        makespan = max((r.end_s for r in records), default=0.0)
        self._sync_shared(kept)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        loss = float(self.loss_total) if self.loss_total is not None else None
        return IterationResult(loss, records, start, makespan, time.perf_counter() - start, self.peak_held)

    def _sync_shared(self, kept: Sequence[torch.Tensor | None]) -> None:
        """Sum this iteration's gradients of the tied weights across their ranks, then add what
        earlier iterations left (summed already): accumulated over steps, each is summed once."""
        for (p, ranks), before in zip(self.shared, kept, strict=True):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.comm.all_reduce_sum([p.grad], ranks)
            if before is not None:
                p.grad = before.add_(p.grad)

    # ------------------------------------------------------------------ messages

    def _pump(self, peer: int) -> None:
        """Post the operations with ``peer`` in their agreed order, up to a send not yet made."""
        ops, k = self.order.get(peer, []), self.cursor.get(peer, 0)
        while k < len(ops):
            op, key = ops[k]
            direction, producer, name, reader, i = key
            tag = self.routing.tag(producer, name, reader, i, direction, self.step)
            if op == SEND:
                if key not in self.made:
                    break
                t = self.made.pop(key)
                self.sends.append((self.comm.isend(t, peer, tag), t, peer, k))
            else:
                spec = self.specs[name]
                buf = torch.empty(spec.shape, dtype=spec.dtype, device=self.device)
                self.posted[key] = (buf, self.comm.irecv(buf, peer, tag), k)
            k += 1
        self.cursor[peer] = k

    def _take(self, key: MessageKey, remote: bool) -> torch.Tensor:
        if not remote:
            return self.local.pop(key)
        if key not in self.posted:
            self._pump(self._peer(key))
        if key not in self.posted:
            raise RuntimeFailure(
                f"internal error: rank {self.comm.rank} needs message {key} before the agreed "
                "message order lets it post the receive; please report this with the plan"
            )
        buf, work, place = self.posted.pop(key)
        work.wait()
        peer = self._peer(key)
        self.heard[peer] = max(self.heard.get(peer, -1), place)
        self.timer.ready()
        return buf

    def _let_go(self) -> None:
        """Finish the sends whose receive the peer has posted, and drop them: their tensors are
        freed once nothing else holds them, not at the iteration's end. A peer posts its
        operations with us in the agreed order, so once a receive of ours at place n in that
        order has completed, every receive the peer matches to our sends before n is posted:
        waiting on those sends cannot wait on us (gloo finishes a send only in its wait)."""
        pending = []
        for entry in self.sends:
            work, _, peer, place = entry
            if work.done() or place < self.heard.get(peer, -1):
                work.wait()  # a failed send raises here
            else:
                pending.append(entry)
        self.sends = pending

    def _peer(self, key: MessageKey) -> int:
        direction, producer, _, reader, _ = key
        return self.routing.rank_of(reader if direction == BACKWARD else producer)

    def _send(self, key: MessageKey, value: torch.Tensor, dst_stage: int) -> None:
        dst = self.routing.rank_of(dst_stage)
        if dst == self.comm.rank:
            self.local[key] = value
            return
        with self.timer.sending():
            self.made[key] = value.detach().contiguous()
            self._pump(dst)

    # ------------------------------------------------------------------ actions

    def _f(self, j: int, i: int) -> None:
        st, R = self.stages[j], self.routing
        got: dict[str, torch.Tensor] = {}
        leaves: dict[str, torch.Tensor] = {}
        for name, src in R.receives[j]:
            v = self._take((FORWARD, src, name, j, i), R.rank_of(src) != self.comm.rank)
            if self.specs[name].requires_grad:
                v = v.detach().requires_grad_(True)
                leaves[name] = v
            got[name] = v
        args = [got[n] if n in got else self.mb_inputs[i][n] for n in st.inputs]
        # Counting saved tensors costs a Python call each (~40% of a small GPT block's
        # forward): count the first forward of each stage only; micro-batches are equal.
        counting = j not in self.stage_saved
        forward = st.module if j != self.last else functools.partial(self._with_loss, st, got, i)
        with self.saved_bytes.count() if counting else contextlib.nullcontext():
            if j in self.recompute:  # the last stage recomputes its loss too
                contexts = functools.partial(_recompute_contexts, st.module)
                # Early stop ends a recomputation with an exception once it has what backward
                # needs: not through the model file's loss_fn, which reports what it raises.
                with set_checkpoint_early_stop(j != self.last):
                    out = checkpoint(forward, *args, use_reentrant=False, context_fn=contexts)
            else:
                out = forward(*args)
        if counting:
            self.stage_saved[j] = self.saved_bytes.total
        held = self.stage_saved[j]
        if j in self.recompute:
            held = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
        loss = None
        if j == self.last:
            *out, loss = out
            d = loss.detach()
            self.loss_total = d if self.loss_total is None else self.loss_total + d
        values = dict(zip(st.outputs, out, strict=True))
        outputs: dict[str, torch.Tensor] = {}
        for name, to in R.readers[j]:
            v = values[name]
            for r in to:
                if r != OUTPUT:
                    self._send((FORWARD, j, name, r, i), v, r)
            if isinstance(v, torch.Tensor) and v.requires_grad and self.specs[name].requires_grad:
                outputs[name] = v
        self.saved[(j, i)] = _Saved(leaves, outputs, loss)
        self.held[(j, i)] = held
        self.peak_held = max(self.peak_held, sum(self.held.values()))

    def _with_loss(self, st: StageModule, got: dict[str, torch.Tensor], i: int, *args: Any) -> tuple[Any, ...]:
        """The last stage's forward: its outputs, then the micro-batch's loss (/ m) on them."""
        out = tuple(st.module(*args))
        have = {**self.mb_inputs[i], **got, **dict(zip(st.outputs, out, strict=True))}
        flat = [have[n] if n is not None else None for n in self.output_names]
        return (*out, self.loss_fn(self.make_output(flat), self.mb_targets[i]) / self.m)

    def _b(self, j: int, i: int) -> None:
        sv, R = self.saved[(j, i)], self.routing
        if sv.loss is not None:
            sv.roots.append(sv.loss)
            sv.grads.append(None)
        for name, value in sv.outputs.items():
            total: torch.Tensor | None = None
            for r in dict(R.readers[j])[name]:
                if r == OUTPUT:
                    continue
                g = self._take((BACKWARD, j, name, r, i), R.rank_of(r) != self.comm.rank)
                total = g if total is None else total + g
            if total is not None:
                sv.roots.append(value)
                sv.grads.append(total)
        names = list(sv.leaves)
        grads: list[torch.Tensor | None] = []
        if self.split_backward and j not in self.recompute:
            if sv.roots:
                grads, sv.weight = backward_input(sv.roots, sv.grads, [sv.leaves[n] for n in names], self.params[j])
            sv.grads = []  # the received gradients: W holds what it restarts from (sv.weight)
        else:  # whole: a recomputed stage's B recomputes once and does its W's work too (see _w)
            if sv.roots:
                torch.autograd.backward(sv.roots, sv.grads)
            grads = [sv.leaves[n].grad for n in names]
            self._free(j, i)
        sources = dict(R.receives[j])
        for n, grad in zip(names, grads, strict=False):
            self._send(
                (BACKWARD, sources[n], n, j, i),
                grad if grad is not None else torch.zeros_like(sv.leaves[n]),
                sources[n],
            )
        for n in names[len(grads) :]:
            self._send((BACKWARD, sources[n], n, j, i), torch.zeros_like(sv.leaves[n]), sources[n])

    def _w(self, j: int, i: int) -> None:
        """The weight gradients B left; nothing for a recomputed stage, whose B did them: every
        autograd call into a checkpointed graph recomputes its forward and keeps what that call
        did not use until the graph is freed, so W's call per group of weights would hold the
        stage's activations once per group."""
        sv = self.saved.get((j, i))
        if sv is None:
            return
        if sv.weight is not None:
            sv.weight.run()
        self._free(j, i)

    def _free(self, j: int, i: int) -> None:
        del self.saved[(j, i)]
        del self.held[(j, i)]
