"""What the kernels may keep of one set of blocks across the problems built on them.

The planner's search builds many :class:`~autopipe.partition.problem.PartitionProblem` on the
same per-block numbers (every decision at one micro-batch size): it makes one
:class:`BlockMemo` per micro-batch size and passes it in (``PartitionProblem(memo=...)``), and
the kernels keep there what depends on the blocks alone — the blocks' check, their arrays,
the chain solver's range sums, a split's per-stage sums. Nothing is kept at module level: a
problem built without a memo keeps nothing, and a memo serves only problems on the very
block tuples it first served (:meth:`BlockMemo.owns`; tuples cannot change).
"""

from __future__ import annotations

import operator
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["BlockMemo", "Recent"]

V = TypeVar("V")


class Recent(Generic[V]):
    """Up to ``size`` answers, the newest first: part of the key by identity (tuples and
    objects that cannot change: cheap to compare however long), part by value."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: list[tuple[tuple[object, ...], object, V]] = []

    def get(self, same: tuple[object, ...], equal: object = ()) -> V | None:
        """The answer kept for the objects ``same`` (each the same object) and the value
        ``equal``; None when none is."""
        for s, e, value in self._items:
            if len(s) == len(same) and all(map(operator.is_, s, same)) and e == equal:
                return value
        return None

    def put(self, same: tuple[object, ...], equal: object, value: V) -> V:
        """Keep ``value`` for ``same`` and ``equal`` (dropping the oldest past ``size``)."""
        self._items.insert(0, (same, equal, value))
        del self._items[self.size :]
        return value


class _Blocks(Protocol):
    """What :meth:`BlockMemo.owns` reads of a problem."""

    @property
    def time_s(self) -> tuple[float, ...]: ...
    @property
    def recompute_s(self) -> tuple[float, ...]: ...
    @property
    def static_bytes(self) -> tuple[float, ...]: ...
    @property
    def activation_bytes(self) -> tuple[float, ...]: ...
    @property
    def tensors(self) -> tuple[Any, ...]: ...


class BlockMemo:
    """One set of blocks' kept answers (see the module docstring); made by the caller."""

    def __init__(self) -> None:
        self._blocks: tuple[object, ...] | None = None
        self.checked = False  # the per-block numbers passed the problem's check
        # Each slot is typed where it is read (this module imports none of its readers: no circle).
        self.flat: Any = None  # stage_sums.Flat: the blocks' arrays
        self.chain: dict[
            tuple[float, float, bool, int], Any
        ] = {}  # chain._Blocks: solve_chain's sums, by link, mode and the block method's k
        self.stats: Recent[Any] = Recent(8)  # problem.StageStats of the last few (problem, assignment)
        self.memory_prefix: Any = None  # planner.bounds: static and activation prefix sums

    def owns(self, p: _Blocks) -> bool:
        """Whether this memo serves ``p``: its per-block tuples are the very ones of the first
        problem it served (and they are tuples: what cannot change)."""
        blocks = (p.time_s, p.recompute_s, p.static_bytes, p.activation_bytes, p.tensors)
        if self._blocks is None:
            if not all(isinstance(x, tuple) for x in blocks):
                return False
            self._blocks = blocks
            return True
        return all(map(operator.is_, self._blocks, blocks))
