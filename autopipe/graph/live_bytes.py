"""Live tensor bytes and their peak, counted as ops make and free storages (:class:`TensorBytes`).

A ``TorchDispatchMode`` sees every op's outputs; each storage is counted once, from the op that
made it until it is freed (a weak reference to the storage, whose Python object torch keeps as
long as the storage lives), at its current size. What the planner's memory model predicts is
what it counts: ``autopipe run`` counts one step per rank with it (``runtime/meters.py``), the
profiler what a block's backward adds and what a split backward keeps for W (``costs/measure/timing.py``).
Not counted: what an op makes and frees inside itself (a kernel's workspace).

Tests: tests/graph/test_live_bytes.py (the counter), tests/runtime/run/test_tensor_bytes.py (a run).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["TensorBytes"]


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    """The storage under ``t``; None for what has none (sparse, meta, a subclass without data)."""
    if t.device.type == "meta" or t.layout != torch.strided:
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _storages(tree: Any) -> list[torch.UntypedStorage]:
    return [s for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and (s := _storage(t)) is not None]


class TensorBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Live tensor bytes while active, and their peak (``with TensorBytes(held): ...``).

    ``held``: tensors alive before that count from the start (parameters, gradients, optimizer
    state); ``ignore``: tensors never counted, nor their views (the caller's batch). Each storage
    counts once, at its current size (an op that resizes one is followed); a storage first seen
    in an op's outputs that was among its inputs (a view of, or a write into, a tensor made
    before counting and not in ``held``) does not count. Thread-safe: a storage made on one
    thread may be freed on another.
    """

    def __init__(self, held: Iterable[torch.Tensor] = (), ignore: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()
        self._sizes: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}
        self._ignored = {id(s): s for s in map(_storage, ignore) if s is not None}  # kept: their ids stay theirs
        self.live = 0
        for t in held:
            self._see(t)
        self.peak = self.live

    def _see(self, t: torch.Tensor, inputs: frozenset[int] = frozenset()) -> None:
        s = _storage(t)
        if s is None or id(s) in self._ignored:
            return
        key, n = id(s), s.nbytes()
        with self._lock:
            known = self._sizes.get(key)
            if known is None and key in inputs:  # a view of (or written into) what was there before
                return
            if known is None:
                self._sizes[key] = (weakref.ref(s, functools.partial(self._freed, key)), n)
                self.live += n
            elif known[1] != n:  # resized
                self._sizes[key] = (known[0], n)
                self.live += n - known[1]

    def _freed(self, key: int, _: object) -> None:
        with self._lock:
            known = self._sizes.pop(key, None)
            if known is not None:
                self.live -= known[1]

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        given = frozenset(id(s) for s in _storages((args, kwargs)))
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t, given)
        if self.live > self.peak:
            self.peak = self.live
        return out
