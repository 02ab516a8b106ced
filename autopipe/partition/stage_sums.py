"""Per-stage sums of a large assignment with numpy (:func:`~autopipe.partition.problem.evaluate`'s
sums for 64 blocks and more; the loop in ``problem.py`` is faster below).

The same sums in the same order as that loop, so the same floats: ``np.bincount`` adds its
weights in input order, and every per-stage total here is a ``bincount`` over blocks, or over
tensors in their order. The same first error too (tests/partition/test_stage_sums.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from autopipe.errors import PlanError

__all__ = ["Flat", "flat_of", "stage_sums"]

Floats = tuple[float, ...]


class Tensor(Protocol):
    """What is read of an :class:`~autopipe.partition.problem.Edge`."""

    @property
    def src(self) -> int: ...
    @property
    def dsts(self) -> tuple[int, ...]: ...
    @property
    def bytes(self) -> float: ...


@dataclass(frozen=True)
class Flat:
    """The per-block numbers as arrays, and per tensor with consumers (a row) its index in
    the problem's tensors, producer, bytes and first entry in ``dst``: all consumers in tensor
    order, each with its row in ``owner``."""

    blocks: tuple[npt.NDArray[np.float64], ...]
    index: npt.NDArray[np.int64]
    src: npt.NDArray[np.int64]
    nbytes: npt.NDArray[np.float64]
    first: npt.NDArray[np.int64]
    dst: npt.NDArray[np.int64]
    owner: npt.NDArray[np.int64]


def flat_of(blocks: tuple[Sequence[float], ...], tensors: Sequence[Tensor]) -> Flat:
    """The arrays :func:`stage_sums` sums (the caller may keep them for its next sums of the
    same blocks: ``partition.memo.BlockMemo``)."""
    used = [(k, t) for k, t in enumerate(tensors) if t.dsts]
    sizes = np.array([len(t.dsts) for _, t in used], dtype=np.int64)
    return Flat(
        blocks=tuple(np.asarray(b, dtype=np.float64) for b in blocks),
        index=np.array([k for k, _ in used], dtype=np.int64),
        src=np.array([t.src for _, t in used], dtype=np.int64),
        nbytes=np.array([t.bytes for _, t in used], dtype=np.float64),
        first=(np.cumsum(sizes) - sizes).astype(np.int64),
        dst=np.array([d for _, t in used for d in t.dsts], dtype=np.int64),
        owner=np.repeat(np.arange(len(used), dtype=np.int64), sizes),
    )


def stage_sums(
    blocks: tuple[Sequence[float], ...],
    tensors: Sequence[Tensor],
    stages: int,
    stage_of_block: Sequence[int],
    flat: Flat | None = None,
) -> tuple[list[Floats], Floats, Floats]:
    """Per stage, the sum of each per-block sequence in ``blocks``; per stage, the bytes
    coming in (tensors produced in an earlier stage, or model inputs); per cut, the bytes
    crossing it. Raises PlanError for a stage out of range, an empty stage or a tensor going back."""
    S, f = (
        stages,
        flat_of(blocks, tensors) if flat is None else flat,
    )  # flat: flat_of(blocks, tensors), kept by the caller
    sa = np.asarray(stage_of_block, dtype=np.int64)
    bad = np.flatnonzero((sa < 0) | (sa >= S))
    if len(bad):
        i = int(bad[0])
        raise PlanError(f"block {i} is assigned to stage {int(sa[i])}; stages are 0..{S - 1}")
    count = np.bincount(sa, minlength=S)
    if not count.all():
        raise PlanError(f"stage {int(np.argmin(count))} has no blocks; every one of the {S} stages needs one")
    sums = [tuple(np.bincount(sa, weights=w, minlength=S).tolist()) for w in f.blocks]
    if not len(f.index):
        return sums, (0.0,) * S, (0.0,) * max(S - 1, 0)
    cs = sa[f.dst]
    low, high = np.minimum.reduceat(cs, f.first), np.maximum.reduceat(cs, f.first)
    lo = np.where(f.src >= 0, sa[np.maximum(f.src, 0)], -1)
    back = np.flatnonzero(lo > low)
    if len(back):
        r = int(back[0])
        raise PlanError(
            f"tensor {int(f.index[r])} goes from block {int(f.src[r])} (stage {int(lo[r])}) back to "
            f"stage {int(low[r])}; stages must not decrease along tensors"
        )
    pairs = np.unique(f.owner * S + cs)  # each consuming stage of a tensor once, tensors in order
    row, stage = pairs // S, pairs % S
    into = stage > lo[row]
    in_bytes = np.bincount(stage[into], weights=f.nbytes[row[into]], minlength=S)
    span = np.where(lo >= 0, high - lo, 0)  # cuts lo .. high-1 carry the tensor
    over = np.repeat(lo - (np.cumsum(span) - span), span) + np.arange(int(span.sum()))
    cut = np.bincount(over, weights=np.repeat(f.nbytes, span), minlength=S - 1)
    return sums, tuple(in_bytes.tolist()), tuple(cut.tolist())
