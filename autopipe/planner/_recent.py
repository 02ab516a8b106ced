"""The last few answers of a function, kept by key (the search asks the same questions of one
micro-batch size's blocks many times): part of the key by identity (tuples and objects that
cannot change: cheap to compare however long), part by value."""

from __future__ import annotations

import operator
from typing import Generic, TypeVar

__all__ = ["Recent"]

V = TypeVar("V")


class Recent(Generic[V]):
    """Up to ``size`` answers, the newest first."""

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
