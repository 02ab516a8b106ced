"""Every rank's stages mean the same: the traces agreed on, the interfaces compared, at start-up.

Each rank traces and splits the model on its own, and values cross ranks by their node's name,
so a name must mean the same value on every rank -- which fails silently when the model's code
iterates over a set of strings (its order follows ``PYTHONHASHSEED``, and with it the order
fx meets ops and so their names; see :mod:`autopipe.graph.canon`). :func:`agreed_split` runs
on every rank after its own split, before anything is sent:

1. the ranks exchange a hash of their traces' ``(name, structural key)`` lists and a digest
   of every stage's interface (one small all-gather). All equal: done -- the common case;
2. otherwise rank 0 sends its list, every other rank relabels its trace to rank 0's names
   and node order (:func:`~autopipe.graph.canon.relabel`) and splits again when it changed,
   and the ranks exchange the digests again.

Any rank that cannot relabel (it traced another model) or any stage whose interface (inputs
and outputs: names, order, shapes, dtypes; where they come from and go; its graph's structural
keys) differs between two ranks fails every rank with the same one-line
:class:`~autopipe.errors.RankMismatchError`: every rank sees the gathered list, so no rank
is left waiting for a peer that gave up, and no value is received as another.

Tests: tests/stages/test_agree.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from autopipe.errors import AutopipeError, RankMismatchError
from autopipe.graph.canon import reference_nodes, relabel, structural_keys
from autopipe.graph.trace import TracedModel
from autopipe.plans import Plan
from autopipe.stages.split import Split, StageModule, split_model

__all__ = ["Gather", "StageDigest", "agreed_split", "check_digests", "stage_digests"]

Gather = Callable[[Any], list[Any]]  # this rank's object -> every rank's (an all-gather)
StageDigest = tuple[int, tuple[str, ...], tuple[str, ...], str]  # stage, inputs, outputs, hash of all
_FIX = "build the model the same way on every rank (same file, arguments, code and library versions)"


def agreed_split(plan: Plan, traced: TracedModel, split: Split, rank: int, gather: Gather) -> tuple[TracedModel, Split]:
    """``traced`` and its ``split`` (of ``plan``) named as rank 0 names them, checked alike on
    every rank (see the module docstring); every rank calls it, with the same ``gather``."""
    nodes = reference_nodes(traced)
    mine = _hash([(name, key) for name, key, _ in nodes])
    first = _by_rank(gather((rank, mine, stage_digests(traced, split))))
    if all(h == first[0][0] for h, _ in first.values()):
        check_digests({r: d for r, (_, d) in first.items()})
        return traced, split
    reference = _by_rank(gather((rank, nodes if rank == 0 else None, None)))[0][0]
    error = None
    try:
        relabelled = relabel(traced, reference, rank=rank)
        if relabelled is not traced:
            traced, split = relabelled, split_model(relabelled, plan)
    except AutopipeError as e:
        error = str(e)
    second = _by_rank(gather((rank, error, None if error else stage_digests(traced, split))))
    for r in sorted(second):
        if second[r][0] is not None:
            raise RankMismatchError(second[r][0])
    check_digests({r: d for r, (_, d) in second.items()})
    return traced, split


def _by_rank(gathered: Sequence[tuple[Any, ...]]) -> dict[int, tuple[Any, ...]]:
    return {int(item[0]): tuple(item[1:]) for item in gathered}


def _hash(obj: Any) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:16]


def stage_digests(traced: TracedModel, split: Split) -> list[StageDigest]:
    """Every stage's interface and computation, in a form two ranks compare."""
    return [_digest(traced, st) for st in split.stages]


def _digest(traced: TracedModel, st: StageModule) -> StageDigest:
    def typed(names: Sequence[str]) -> list[tuple[str, tuple[int, ...], str]]:
        infos = [traced.values.get(n) for n in names]
        return [(n, (), "?") if v is None else (n, tuple(v.shape), v.dtype) for n, v in zip(names, infos, strict=True)]

    keys = structural_keys(st.module)
    whole = (
        st.rank,
        typed(st.inputs),
        typed(st.outputs),
        st.sources,
        st.sends,
        [keys[n.name] for n in st.module.graph.nodes],
    )
    return (st.index, st.inputs, st.outputs, _hash(whole))


def check_digests(digests: dict[int, list[StageDigest]]) -> None:
    """RankMismatchError naming the first stage on which two ranks' digests differ."""
    ranks = sorted(digests)
    base = digests[ranks[0]]
    for r in ranks[1:]:
        theirs = digests[r]
        if len(theirs) != len(base):
            raise RankMismatchError(
                f"ranks {ranks[0]} and {r} split the plan into {len(base)} and {len(theirs)} stages; {_FIX}"
            )
        for a, b in zip(base, theirs, strict=True):
            if a != b:
                raise RankMismatchError(
                    f"ranks {ranks[0]} and {r} disagree on stage {a[0]}'s interface ({_say(a)} on rank {ranks[0]}; "
                    f"{_say(b) if a[1:3] != b[1:3] else 'the same names but other shapes, dtypes or ops'} "
                    f"on rank {r}); {_FIX}"
                )


def _say(d: StageDigest) -> str:
    def names(xs: Sequence[str]) -> str:
        return ", ".join(xs[:6]) + (f", ... ({len(xs)})" if len(xs) > 6 else "") if xs else "none"

    return f"inputs {names(d[1])}; outputs {names(d[2])}"
