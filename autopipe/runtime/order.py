"""One order of the messages between each pair of ranks, the same on both sides (NCCL-safe).

gloo matches a receive to the send with the same tag; NCCL ignores tags: between two ranks,
the k-th operation one side posts meets the k-th the other side posts, and each side's
operations with that peer run one after another (one stream per pair). So both ranks of a
pair must post their sends and receives to each other in one agreed order, and that order
must never make a rank wait for a message its peer can only make later.

The order: simulate the iteration (every rank runs its actions in order; an action starts
when the rank is free and the messages it reads have been made; durations from the plan's
predictions) and sort each pair's messages by the time they are made. It is a pure function
of the plan, so every rank computes the same one. It never deadlocks: if message ``s``
(a -> b) comes before ``m`` (b -> a), ``s`` is made no later than ``m``, so the action of a
that makes ``s`` ends before the action of a that reads ``m`` starts: a posts ``s`` before it
needs ``m``. The engine posts each pair's operations strictly in this order, receives as
early as the order allows (so they are ready when needed), sends as soon as they are made.

Tests: tests/runtime/test_engine.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from autopipe.errors import PlanError
from autopipe.runtime.routing import BACKWARD, FORWARD, Routing
from autopipe.runtime.shapes import TensorSpec
from autopipe.schedules import Action
from autopipe.stages.split import OUTPUT

__all__ = ["RECV", "SEND", "MessageKey", "incoming", "message_order", "outgoing"]

MessageKey = tuple[int, int, str, int, int]  # (direction, producer stage, value, reader stage, mb)
SEND, RECV = 0, 1


def incoming(a: Action, routing: Routing, specs: Mapping[str, TensorSpec]) -> Iterator[MessageKey]:
    """The messages from other ranks that action ``a`` reads."""
    R, j, i = routing, a.stage, a.microbatch
    me = R.rank_of(j)
    if a.kind == "F":
        for name, src in R.receives[j]:
            if R.rank_of(src) != me:
                yield (FORWARD, src, name, j, i)
    elif a.kind == "B":
        for name, to in R.readers[j]:
            if specs[name].requires_grad:
                for r in to:
                    if r != OUTPUT and R.rank_of(r) != me:
                        yield (BACKWARD, j, name, r, i)


def outgoing(a: Action, routing: Routing, specs: Mapping[str, TensorSpec]) -> Iterator[MessageKey]:
    """The messages to other ranks that action ``a`` makes."""
    R, j, i = routing, a.stage, a.microbatch
    me = R.rank_of(j)
    if a.kind == "F":
        for name, to in R.readers[j]:
            for r in to:
                if r != OUTPUT and R.rank_of(r) != me:
                    yield (FORWARD, j, name, r, i)
    elif a.kind == "B":
        for name, src in R.receives[j]:
            if specs[name].requires_grad and R.rank_of(src) != me:
                yield (BACKWARD, src, name, j, i)


def message_order(
    schedule: Mapping[int, Sequence[Action | None]],
    routing: Routing,
    specs: Mapping[str, TensorSpec],
    duration: Callable[[Action], float],
) -> dict[int, dict[int, list[tuple[int, MessageKey]]]]:
    """rank -> peer -> the (SEND or RECV, message) operations between them, in order."""
    ranks = sorted(schedule)
    todo = {r: [a for a in schedule[r] if a is not None] for r in ranks}
    pos, free = dict.fromkeys(ranks, 0), dict.fromkeys(ranks, 0.0)
    made: dict[MessageKey, float] = {}
    stamped: list[tuple[float, int, int, int, MessageKey]] = []  # (time, rank, step, k, msg)
    step = 0
    while any(pos[r] < len(todo[r]) for r in ranks):
        best: tuple[float, int] | None = None
        for r in ranks:
            if pos[r] == len(todo[r]):
                continue
            needs = list(incoming(todo[r][pos[r]], routing, specs))
            if all(m in made for m in needs):
                start = max([free[r], *(made[m] for m in needs)])
                best = min(best, (start, r)) if best is not None else (start, r)
        if best is None:
            stuck = {r: str(todo[r][pos[r]]) for r in ranks if pos[r] < len(todo[r])}
            raise PlanError(
                f"the schedule deadlocks: every rank waits for a message not yet sent ({stuck}); plan again"
            )
        start, r = best
        a = todo[r][pos[r]]
        free[r] = start + max(duration(a), 1e-9)
        for k, msg in enumerate(outgoing(a, routing, specs)):
            made[msg] = free[r]
            stamped.append((free[r], r, step, k, msg))
        pos[r] += 1
        step += 1
    order: dict[int, dict[int, list[tuple[int, MessageKey]]]] = {r: {} for r in ranks}
    for _, src, _, _, msg in sorted(stamped):
        dst = routing.rank_of(msg[3] if msg[0] == FORWARD else msg[1])
        order[src].setdefault(dst, []).append((SEND, msg))
        order[dst].setdefault(src, []).append((RECV, msg))
    return order
