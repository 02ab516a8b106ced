"""What the engine measures while it runs: action times and the memory it holds.

Times: ``time.perf_counter`` on the CPU; on a GPU, CUDA events recorded around each action on
the current stream and read once at the end of the iteration (no synchronisation between
actions, so measuring does not serialise the pipeline).

Memory (:class:`PeakMemory`): on a GPU, ``torch.cuda.max_memory_allocated`` (everything the
rank allocated). On a Linux CPU the process's peak resident memory during the steps: the peak
(``VmHWM``) is reset to the current resident size (``/proc/self/clear_refs``) before the first
step and read after the last; the rank's parameters, allocated before, are added to the growth
(so: parameters + everything the steps allocated at their peak -- gradients, optimizer state,
activations, communication buffers -- including the allocator's slack and torch's own
workspaces). Elsewhere the lifetime peak (``getrusage``), which may predate the steps; the
``memory_kind`` says which. The engine also counts what the planner's memory model counts
(:class:`SavedBytes`: bytes saved for backward by each forward, every storage once, parameters
excluded; for a recomputed stage the bytes of its inputs), kept as the run's
``peak_activation_bytes`` beside the measurement.

Live tensor bytes, what the planner's memory model predicts (:func:`tensor_bytes_meter`): on
the CPU :class:`~autopipe.graph.live_bytes.TensorBytes` (every storage an op makes, once, until
it is freed; the tensors held before -- the rank's parameters, buffers, gradients and
optimizer state -- from the start; its peak read after every op): parameters, gradients,
optimizer state, saved activations, the gradients backward makes, messages being sent or
received; not a kernel's own workspace, nor the caller's batch. Every op pays a Python call,
so a run counts one step (``autopipe.runtime.run.worker``). On a GPU the same figure is
``torch.cuda.max_memory_allocated`` over that step.

Tests: tests/runtime/test_meters.py.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from autopipe.graph.live_bytes import TensorBytes

__all__ = ["ActionTimer", "CudaPeak", "PeakMemory", "SavedBytes", "TensorBytes", "state_bytes", "tensor_bytes_meter"]


class ActionTimer:
    """Start, ready and end seconds of each action, relative to :meth:`reset`.

    :meth:`ready` marks the moment an action's received messages are in (call it after each
    wait; the last call counts): the time before is waiting, the time after is work.
    :meth:`sending` times the part of the work spent handing messages to another rank (host
    time, ``perf_counter``, on a GPU too: posting is the host's work).
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.t0 = 0.0
        self._events: list[tuple[Any, Any, Any, Any]] = []
        self._cpu: list[tuple[Any, float, float, float]] = []
        self._sent: list[float] = []  # per action, in order: seconds spent in sending()
        self._origin: Any = None
        self._ready: Any = None
        self._sending = 0.0

    def reset(self) -> float:
        """Start a new iteration; returns its absolute start (``perf_counter``)."""
        self._events, self._cpu, self._sent = [], [], []
        if self.cuda:
            self._origin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._origin.record()
        self.t0 = time.perf_counter()
        return self.t0

    def ready(self) -> None:
        if self.cuda:  # after the stream waits for a receive: fires when the data is in
            self._ready = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._ready.record()
        else:
            self._ready = time.perf_counter() - self.t0

    @contextmanager
    def sending(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sending += time.perf_counter() - t0

    @contextmanager
    def time(self, key: Any) -> Iterator[None]:
        self._ready = None
        self._sending = 0.0
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            yield
            end.record()
            self._events.append((key, start, start if self._ready is None else self._ready, end))
            self._sent.append(self._sending)
        else:
            start_s = time.perf_counter() - self.t0
            yield
            ready = start_s if self._ready is None else self._ready
            self._cpu.append((key, start_s, ready, time.perf_counter() - self.t0))
            self._sent.append(self._sending)

    def results(self) -> list[tuple[Any, float, float, float, float]]:
        """``(key, start, ready, end, sending)`` of every action of the iteration, in order."""
        if not self.cuda:
            return [(*x, p) for x, p in zip(self._cpu, self._sent, strict=True)]
        torch.cuda.synchronize()
        at = self._origin.elapsed_time
        return [
            (k, at(s) / 1e3, at(r) / 1e3, at(e) / 1e3, p)
            for (k, s, r, e), p in zip(self._events, self._sent, strict=True)
        ]


class SavedBytes:
    """Counts the bytes autograd saves for backward inside :meth:`count` (each storage once)."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude  # storage data pointers of parameters
        self.total = 0
        self._seen: set[int] = set()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self.exclude and ptr not in self._seen:
                self._seen.add(ptr)
                self.total += storage.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    @contextmanager
    def count(self) -> Iterator[None]:
        self.total, self._seen = 0, set()
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield


def state_bytes(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters, their gradients (held from the first backward to the step, so
    counted whether or not they are there now) and the optimizer's state tensors."""
    total = sum(p.numel() * p.element_size() for p in params)
    total += sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    for state in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return int(total)


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMemory:
    """The rank's peak memory over the steps between :meth:`start` and :meth:`stop`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rss_before = 0
        self.reset = False

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current resident size
            self.reset = _status_kib("VmHWM") is not None
        except OSError:
            self.reset = False
        self.rss_before = (_status_kib("VmRSS") or 0) * 1024

    def stop(self, param_bytes: int) -> tuple[int, str]:
        """``(bytes, what they are)`` -- ``memory_kind`` in the report."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device)), "cuda: torch.cuda.max_memory_allocated"
        if self.reset:
            peak = (_status_kib("VmHWM") or 0) * 1024
            how = "cpu: peak resident memory during the steps (VmHWM, reset before the first step)"
        else:
            scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
            how = "cpu: the process's lifetime peak resident memory (getrusage; could not reset the peak)"
        grown = max(0, peak - self.rss_before)
        return grown + param_bytes, f"{how} minus resident memory before it, plus the rank's parameter bytes"


class CudaPeak:
    """On a GPU: ``torch.cuda.max_memory_allocated`` over the block (every tensor the rank holds)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.peak = device, 0

    def __enter__(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def __exit__(self, *exc: object) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = int(torch.cuda.max_memory_allocated(self.device))


def tensor_bytes_meter(
    device: torch.device, held: Iterable[torch.Tensor] = (), ignore: Iterable[torch.Tensor] = ()
) -> TensorBytes | CudaPeak:
    """The peak live tensor bytes of the block it guards, read from ``.peak`` after it:
    :class:`TensorBytes` on the CPU, CUDA's allocator statistics on a GPU."""
    if device.type == "cuda":
        return CudaPeak(device)
    return TensorBytes(held, ignore)
