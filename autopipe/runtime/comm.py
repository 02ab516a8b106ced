"""Point-to-point transfers and the one collective the engine needs, behind one interface.

:class:`DistComm` is ``torch.distributed`` (gloo on CPU, NCCL on CUDA): ``isend``/``irecv``
return at once and are waited on only when the data is needed (receives) or at the end of the
iteration (sends), so transfers overlap compute. Every wait has a timeout; a peer that died
(connection closed) or hung (timeout) raises :class:`~autopipe.errors.CommunicationError`
naming the peer, never a silent hang.

:class:`ThreadComm` runs every rank as a thread of one process with in-memory mailboxes: the
same engine, no processes, for tests and debugging a plan. It matches messages as NCCL does
-- the k-th receive a rank posts from a peer meets the k-th send of that peer to it -- and
checks the tags agree, so the thread tests prove the engine's operation order NCCL-safe.

The engine gives every tensor of an iteration its own tag (gloo matches receives to sends by
tag) and posts each pair's operations in one agreed order (``autopipe.runtime.order``; NCCL
ignores tags).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from autopipe.errors import CommunicationError
from autopipe.model.usercode import first_line

__all__ = ["Comm", "DistComm", "ThreadComm", "ThreadHub", "Work"]


class Work(Protocol):
    def wait(self) -> None: ...

    def done(self) -> bool: ...  # finished (wait() returns at once, raising if it failed)


class Comm(Protocol):
    """What the engine needs from the transport."""

    rank: int
    world: int

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work: ...

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work: ...

    def all_reduce_sum(self, tensors: Sequence[torch.Tensor], ranks: tuple[int, ...]) -> None: ...

    def barrier(self) -> None: ...

    def all_gather_object(self, obj: Any) -> list[Any]: ...


# ----------------------------------------------------------------------------- torch.distributed


def _reason(e: BaseException) -> str:
    """The first line of a torch.distributed error without its ``[file.cc:78]`` prefix."""
    return re.sub(r"^\[[^\]]*\]\s*", "", first_line(e)) or type(e).__name__


@dataclass
class _DistWork:
    work: Any
    what: str
    timeout: timedelta

    def wait(self) -> None:
        try:
            ok = self.work.wait(self.timeout)
        except Exception as e:
            raise CommunicationError(f"{self.what} failed: {_reason(e)}") from e
        if ok is False:
            raise CommunicationError(f"{self.what} timed out after {self.timeout.total_seconds():g}s")

    def done(self) -> bool:
        return bool(self.work.is_completed())


class DistComm:
    """``torch.distributed`` point-to-point with timeouts (the process group must exist)."""

    def __init__(self, timeout_s: float, groups: Sequence[tuple[int, ...]] = ()) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.timeout = timedelta(seconds=timeout_s)
        # new_group is collective: every rank creates every group, in the same order.
        self._groups: dict[tuple[int, ...], Any] = {}
        for g in sorted(set(groups)):
            self._groups[g] = dist.new_group(list(g), timeout=self.timeout) if len(g) < self.world else None

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        try:
            work = dist.isend(tensor, dst, tag=tag)
        except Exception as e:
            raise CommunicationError(f"sending to rank {dst} failed: {_reason(e)}") from e
        return _DistWork(work, f"sending to rank {dst}", self.timeout)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        try:
            work = dist.irecv(tensor, src, tag=tag)
        except Exception as e:
            raise CommunicationError(f"receiving from rank {src} failed: {_reason(e)}") from e
        return _DistWork(work, f"receiving from rank {src}", self.timeout)

    def all_reduce_sum(self, tensors: Sequence[torch.Tensor], ranks: tuple[int, ...]) -> None:
        group = self._groups.get(tuple(sorted(ranks)))
        for t in tensors:
            try:
                work = dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group, async_op=True)
            except Exception as e:
                raise CommunicationError(f"all-reduce among ranks {list(ranks)} failed: {_reason(e)}") from e
            _DistWork(work, f"all-reduce among ranks {list(ranks)}", self.timeout).wait()

    def barrier(self) -> None:
        try:
            work = dist.barrier(async_op=True)
        except Exception as e:
            raise CommunicationError(f"barrier failed: {_reason(e)}") from e
        _DistWork(work, "barrier", self.timeout).wait()

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        try:
            dist.all_gather_object(out, obj)
        except Exception as e:
            raise CommunicationError(f"gathering results failed: {_reason(e)}") from e
        return out


# ----------------------------------------------------------------------------- threads


@dataclass
class ThreadHub:
    """The shared mailboxes of ``world`` thread-ranks."""

    world: int
    timeout_s: float = 60.0
    cond: threading.Condition = field(default_factory=threading.Condition)
    sent: dict[tuple[int, int], list[tuple[int, torch.Tensor]]] = field(default_factory=dict)
    received: dict[tuple[int, int], int] = field(default_factory=dict)  # receives posted
    rounds: dict[tuple[str, tuple[int, ...], int], dict[int, Any]] = field(default_factory=dict)
    counters: dict[tuple[int, str, tuple[int, ...]], int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def comm(self, rank: int) -> ThreadComm:
        return ThreadComm(self, rank)

    def fail(self, message: str) -> None:
        with self.cond:
            self.failed.append(message)
            self.cond.notify_all()

    def wait_for(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            while not ready():
                if self.failed:
                    raise CommunicationError(f"{what} failed: a peer failed ({self.failed[0]})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommunicationError(f"{what} timed out after {self.timeout_s:g}s")
                self.cond.wait(left)


@dataclass
class _Done:
    def wait(self) -> None:
        return None

    def done(self) -> bool:
        return True


@dataclass
class _ThreadRecv:
    hub: ThreadHub
    pair: tuple[int, int]  # (source, destination)
    index: int  # the k-th receive posted on the pair meets the k-th send, as with NCCL
    tag: int
    buffer: torch.Tensor

    def wait(self) -> None:
        box = self.hub.sent
        what = f"receiving from rank {self.pair[0]}"
        self.hub.wait_for(lambda: len(box.get(self.pair, ())) > self.index, what)
        with self.hub.cond:
            tag, value = box[self.pair][self.index]
        if tag != self.tag:  # gloo would match by tag; NCCL would deliver the wrong tensor
            raise CommunicationError(
                f"{what}: receive {self.index} expected tag {self.tag}, the send has tag {tag} "
                "(the ranks post their operations in different orders)"
            )
        self.buffer.copy_(value)

    def done(self) -> bool:
        with self.hub.cond:
            return len(self.hub.sent.get(self.pair, ())) > self.index


class ThreadComm:
    """One thread-rank's view of a :class:`ThreadHub`."""

    def __init__(self, hub: ThreadHub, rank: int) -> None:
        self.hub = hub
        self.rank = rank
        self.world = hub.world

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        with self.hub.cond:
            box = self.hub.sent.setdefault((self.rank, dst), [])
            box.append((tag, tensor.detach().clone()))
            self.hub.cond.notify_all()
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        with self.hub.cond:
            index = self.hub.received.get((src, self.rank), 0)
            self.hub.received[(src, self.rank)] = index + 1
        return _ThreadRecv(self.hub, (src, self.rank), index, tag, tensor)

    def _exchange(self, kind: str, ranks: tuple[int, ...], value: Any) -> dict[int, Any]:
        hub = self.hub
        with hub.cond:
            n = hub.counters.get((self.rank, kind, ranks), 0)
            hub.counters[(self.rank, kind, ranks)] = n + 1
            box = hub.rounds.setdefault((kind, ranks, n), {})
            box[self.rank] = value
            hub.cond.notify_all()
        hub.wait_for(lambda: len(box) == len(ranks), kind)
        return box

    def all_reduce_sum(self, tensors: Sequence[torch.Tensor], ranks: tuple[int, ...]) -> None:
        ranks = tuple(sorted(ranks))
        box = self._exchange("all-reduce", ranks, [t.detach().clone() for t in tensors])
        with torch.no_grad():
            for i, t in enumerate(tensors):
                total = box[ranks[0]][i].clone()
                for r in ranks[1:]:
                    total += box[r][i]
                t.copy_(total)

    def barrier(self) -> None:
        self._exchange("barrier", tuple(range(self.world)), None)

    def all_gather_object(self, obj: Any) -> list[Any]:
        box = self._exchange("gather", tuple(range(self.world)), obj)
        return [box[r] for r in range(self.world)]
