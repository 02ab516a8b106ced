"""The executor's own costs, measured on this host: per action, and per send to another rank.

A profile times each block alone; autopipe's executor (:mod:`autopipe.runtime.engine`) spends
more on each action (taking its inputs, the autograd call, the bookkeeping and the timer) and,
in an action that sends to another rank, more again (copying the tensor out and handing it to
gloo, whose threads then share the cores). The planner prices both (``action_overhead_s``,
``send_overhead_s``; :mod:`autopipe.simulate.sends`); this probe measures them with the real
engine on a pipeline of two small layers (:data:`WIDTH` features, :data:`ROWS` rows a
micro-batch, :data:`MICRO_BATCHES` micro-batches), one thread::

    local   both stages on this rank (a one-rank thread transport: nothing leaves it), each
            micro-batch F0 F1 B1 B0; per action, its recorded work (``ActionRecord.compute_s``)
            minus the same forward or backward timed bare (the layer called, autograd's
            backward called), as the profiler times a block          -> the cost per action
    remote  stage 0 here, stage 1 on a peer thread of this process, the two joined by a pair of
            gloo process groups over loopback TCP (the transport ``autopipe run`` uses on CPU),
            1F1B; the peer receives the activations and returns gradients in the engine's agreed
            message order. Stage 0's F now posts a send to another rank:
            its work minus the local run's stage 0 F                 -> the cost per send

Rounds alternate a local and a remote iteration (after one warm-up of each), so a change in the
host's load reaches both; each round gives one estimate of each cost, and :func:`measure_executor`
returns them all (``api.py`` keeps their median and spread in the profile,
``costs.profile.ExecutorCost``). Throughout, a neighbour thread keeps one core busy with matrix
products (torch lets go of the GIL while it multiplies), as the other rank of a run computes
meanwhile: gloo's threads then find the cores taken, as they do in ``autopipe run``, and the
bare, local and remote timings all share that neighbour, so it cancels out of both differences.
Anything that fails (no gloo, a timeout) returns None and logs why: the planner then takes its
defaults. Tests: tests/runtime/test_probe.py.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
from torch import nn

from autopipe.runtime.comm import ThreadHub, Work
from autopipe.runtime.engine import IterationResult, PipelineEngine
from autopipe.runtime.order import RECV, MessageKey, message_order
from autopipe.runtime.routing import BACKWARD, Routing
from autopipe.runtime.shapes import TensorSpec
from autopipe.schedules import Action, Kind, schedule_spec
from autopipe.stages.split import OUTPUT, StageModule

__all__ = ["MICRO_BATCHES", "ROUNDS", "ROWS", "WIDTH", "ExecutorSamples", "measure_executor"]

log = logging.getLogger("autopipe")

WIDTH = 256  # features of each layer
ROWS = 16  # rows of a micro-batch: a 16 KiB message
MICRO_BATCHES = 8  # per iteration
ROUNDS = 5  # estimates of each cost (one local and one remote iteration each)
TIMEOUT_S = 10.0  # a gloo operation that has not finished by then fails the probe
NEIGHBOUR = 384  # the neighbour's square matrices (a product takes a few milliseconds on one core)


@dataclass(frozen=True)
class ExecutorSamples:
    """One estimate per round of the executor's cost per action and per send (seconds)."""

    action_s: tuple[float, ...]
    send_s: tuple[float, ...]


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.nn.functional.gelu(self.linear(x)),)  # (ROWS, WIDTH)


def _stages(placement: tuple[int, int]) -> tuple[list[StageModule], Routing]:
    torch.manual_seed(0)
    gms = [torch.fx.symbolic_trace(_Layer()) for _ in range(2)]
    stages = [
        StageModule(0, placement[0], gms[0], ("x",), ("h",), (-1,), ((1,),), ()),
        StageModule(1, placement[1], gms[1], ("h",), ("y",), (0,), ((OUTPUT,),), ()),
    ]
    routing = Routing(
        ranks=max(placement) + 1,
        micro_batches=MICRO_BATCHES,
        receives={0: (), 1: (("h", 0),)},
        extras={0: (), 1: ()},
        readers={0: (("h", (1,)),), 1: (("y", (OUTPUT,)),)},
        edges={(0, "h", 1): 0},
        placement=placement,
    )
    return stages, routing


_SPECS = {
    "x": TensorSpec((ROWS, WIDTH), torch.float32, False),
    "h": TensorSpec((ROWS, WIDTH), torch.float32, True),
    "y": TensorSpec((ROWS, WIDTH), torch.float32, True),
}


def _loss(out: object, target: object) -> torch.Tensor:
    assert isinstance(out, torch.Tensor)
    return (out * out).mean()


def _engine(
    stages: Sequence[StageModule], actions: Sequence[Action | None], routing: Routing, comm: Any, order: Any
) -> PipelineEngine:
    return PipelineEngine(
        stages,
        actions,
        routing,
        _SPECS,
        comm,
        input_names=("x",),
        output_names=("y",),
        make_output=lambda flat: flat[0],
        loss_fn=_loss,
        order=order,
        last_stage=1,
    )


# ----------------------------------------------------------------------------- the gloo pair


@dataclass
class _GlooWork:
    work: Any

    def wait(self) -> None:
        if self.work.wait(timedelta(seconds=TIMEOUT_S)) is False:
            raise TimeoutError(f"a gloo operation took more than {TIMEOUT_S:g}s")

    def done(self) -> bool:
        return bool(self.work.is_completed())


class _GlooComm:
    """One end of an in-process gloo pair, as the engine's ``Comm``."""

    def __init__(self, group: Any, rank: int) -> None:
        self.group, self.rank, self.world = group, rank, 2

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        return _GlooWork(self.group.send([tensor], dst, tag))

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return _GlooWork(self.group.recv([tensor], src, tag))

    def all_reduce_sum(self, tensors: Sequence[torch.Tensor], ranks: tuple[int, ...]) -> None:
        raise NotImplementedError("the probe's pipeline shares no parameters")

    def barrier(self) -> None:
        _GlooWork(self.group.barrier()).wait()

    def all_gather_object(self, obj: Any) -> list[Any]:
        raise NotImplementedError("the probe's pipeline gathers nothing")


def _gloo_pair() -> list[Any]:
    """Two gloo process groups of one world of 2, made on two threads (they meet in a store)."""
    store = dist.HashStore()  # type: ignore[attr-defined]
    groups: list[Any] = [None, None]
    failed: list[BaseException] = []

    def make(rank: int) -> None:
        try:
            groups[rank] = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=TIMEOUT_S))
        except BaseException as e:  # reported by the caller
            failed.append(e)

    threads = [threading.Thread(target=make, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    if failed or any(g is None for g in groups):
        raise RuntimeError(f"could not make a gloo pair: {failed[0] if failed else 'timed out'}")
    return groups


def _peer(group: Any, ops: Sequence[tuple[int, MessageKey]], routing: Routing, iterations: int) -> None:
    """Rank 1 of the remote runs: per iteration, the barrier, then its operations with rank 0
    in the agreed order (a received activation answered by a gradient of ones). A failure ends
    it quietly: rank 0 then times out waiting for it and reports that."""
    try:
        _answer(group, ops, routing, iterations)
    except Exception as e:
        log.debug("the executor probe's peer stopped: %s", e)


def _answer(group: Any, ops: Sequence[tuple[int, MessageKey]], routing: Routing, iterations: int) -> None:
    buf = torch.empty(_SPECS["h"].shape)
    grad = torch.ones(_SPECS["h"].shape)
    for step in range(iterations):
        _GlooWork(group.barrier()).wait()
        sends = []
        for op, key in ops:
            direction, producer, name, reader, i = key
            tag = routing.tag(producer, name, reader, i, direction, step)
            if op == RECV:
                _GlooWork(group.recv([buf], 0, tag)).wait()
            else:
                assert direction == BACKWARD
                sends.append(_GlooWork(group.send([grad], 0, tag)))
        for w in sends:
            w.wait()


# ----------------------------------------------------------------------------- timing


class _Neighbour:
    """A thread multiplying matrices until stopped: the other rank's compute, on another core."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        a = torch.randn(NEIGHBOUR, NEIGHBOUR)
        out = torch.empty_like(a)
        while not self.stop.is_set():
            torch.mm(a, a, out=out)

    def __enter__(self) -> _Neighbour:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(TIMEOUT_S)


def _bare(stages: Sequence[StageModule], x: torch.Tensor, repeat: int) -> dict[tuple[int, str], float]:
    """Median seconds of each stage's forward and backward called bare, as the profiler times a
    block (the last stage's with the loss)."""
    out: dict[tuple[int, str], list[float]] = {}
    g = torch.ones(_SPECS["h"].shape)
    for _ in range(repeat):
        leaf = x.detach().requires_grad_(True)
        for st in stages:
            arg = x if st.index == 0 else leaf
            t0 = time.perf_counter()
            (y,) = st.module(arg)
            root = _loss(y, None) / MICRO_BATCHES if st.index == 1 else y
            t1 = time.perf_counter()
            torch.autograd.backward([root], [None if st.index == 1 else g])
            t2 = time.perf_counter()
            out.setdefault((st.index, "F"), []).append(t1 - t0)
            out.setdefault((st.index, "B"), []).append(t2 - t1)
    return {k: statistics.median(v) for k, v in out.items()}


def _work(result: IterationResult) -> dict[tuple[int, str], float]:
    """Median recorded work per (stage, kind) of one iteration."""
    out: dict[tuple[int, str], list[float]] = {}
    for rec in result.records:
        a = Action.parse(rec.action)
        if a is not None:
            out.setdefault((a.stage, str(a.kind)), []).append(rec.compute_s)
    return {k: statistics.median(v) for k, v in out.items()}


def measure_executor(rounds: int = ROUNDS) -> ExecutorSamples | None:
    """:data:`ROUNDS` estimates of the executor's cost per action and per send (the module
    docstring), on the calling thread's torch settings; None where the probe could not run."""
    try:
        return _measure(rounds)
    except Exception as e:  # a probe that cannot run leaves the planner its defaults
        log.info("executor costs not measured (%s: %s); the planner's defaults apply", type(e).__name__, e)
        return None


def _measure(rounds: int) -> ExecutorSamples:
    m = MICRO_BATCHES
    torch.manual_seed(0)
    inputs = [[torch.randn(_SPECS["x"].shape)] for _ in range(m)]
    targets: list[object] = [None] * m
    # local: both stages on rank 0, F0 F1 B1 B0 per micro-batch
    local_stages, local_routing = _stages((0, 0))
    kinds = (Kind.FORWARD, Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD)
    local_actions = [Action(s, k, i) for i in range(m) for s, k in zip((0, 1, 1, 0), kinds, strict=True)]
    local = _engine(local_stages, local_actions, local_routing, ThreadHub(1, TIMEOUT_S).comm(0), {})
    # remote: stage 0 here, stage 1 on the peer thread, 1F1B
    remote_stages, routing = _stages((0, 1))
    schedule = schedule_spec("1f1b").create_schedule(2, m, 1)
    order = message_order(schedule, routing, _SPECS, lambda a: 2.0 if a.kind == "B" else 1.0)
    groups = _gloo_pair()
    remote = _engine(remote_stages[:1], schedule[0], routing, _GlooComm(groups[0], 0), order[0])
    peer = threading.Thread(target=_peer, args=(groups[1], order[1][0], routing, rounds + 1), daemon=True)
    peer.start()
    try:
        with _Neighbour():
            return _rounds(rounds, inputs, targets, local, remote, local_stages, remote_stages)
    finally:
        peer.join(TIMEOUT_S)
        if peer.is_alive():
            raise TimeoutError("the probe's peer did not finish")


def _rounds(
    rounds: int,
    inputs: list[list[torch.Tensor]],
    targets: list[object],
    local: PipelineEngine,
    remote: PipelineEngine,
    local_stages: Sequence[StageModule],
    remote_stages: Sequence[StageModule],
) -> ExecutorSamples:
    """A warm-up, then ``rounds`` rounds of a local and a remote iteration and the bare timings:
    one estimate of each cost per round."""
    action, send = [], []
    for step in range(rounds + 1):
        here = _work(local.forward_backward(inputs, targets, step))
        there = _work(remote.forward_backward(inputs, targets, step))
        bare = _bare(local_stages, inputs[0][0], 3)
        for st in (*local_stages, *remote_stages):
            for p in st.module.parameters():
                p.grad = None
        if step == 0:  # the warm-up
            continue
        action.append(max(0.0, statistics.fmean(here[k] - bare[k] for k in bare)))
        send.append(max(0.0, there[(0, "F")] - here[(0, "F")]))
    return ExecutorSamples(tuple(action), tuple(send))
