"""Who sends what to whom: the messages of one iteration, derived from a Split.

For virtual stage ``j`` the engine needs: the values it receives from other stages (its
module's inputs made elsewhere, plus, on the last stage, model outputs made on earlier
stages), and for each value it makes the stages that read it. Skip connections are direct:
a value goes from its producer to every reader, not through the stages in between.

Every (producer, value, reader) triple is an *edge* with a fixed number; a message is an edge,
a micro-batch, a direction (activation forward or gradient back) and the iteration's parity,
which gives each message of an iteration its own tag — computed identically on every rank.
A stage runs on the rank the plan gives it (``StagePlan.rank``, the schedule's placement).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopipe.stages.split import OUTPUT, Split

__all__ = ["Routing", "make_routing"]

FORWARD, BACKWARD = 0, 1


@dataclass(frozen=True)
class Routing:
    ranks: int  # S
    micro_batches: int  # m
    receives: dict[int, tuple[tuple[str, int], ...]]  # stage -> (value, producer stage)
    extras: dict[int, tuple[str, ...]]  # stage -> received model outputs its module does not read
    readers: dict[int, tuple[tuple[str, tuple[int, ...]], ...]]  # stage -> (value, reader stages)
    edges: dict[tuple[int, str, int], int]  # (producer, value, reader) -> edge number
    placement: tuple[int, ...]  # stage -> the rank that runs it

    def rank_of(self, stage: int) -> int:
        return self.placement[stage]

    def tag(self, producer: int, value: str, reader: int, microbatch: int, direction: int, step: int) -> int:
        edge = self.edges[(producer, value, reader)]
        return ((edge * self.micro_batches + microbatch) * 2 + direction) * 2 + step % 2


def make_routing(split: Split, ranks: int, micro_batches: int) -> Routing:
    """The message plan of ``split`` on ``ranks`` ranks with ``micro_batches`` micro-batches."""
    readers: dict[int, tuple[tuple[str, tuple[int, ...]], ...]] = {}
    sent_to: dict[int, list[tuple[str, int]]] = {}
    edges: dict[tuple[int, str, int], int] = {}
    for st in split.stages:
        outs = []
        for name, to in zip(st.outputs, st.sends, strict=True):
            outs.append((name, to))
            for r in to:
                if r != OUTPUT:
                    edges[(st.index, name, r)] = len(edges)
                    sent_to.setdefault(r, []).append((name, st.index))
        readers[st.index] = tuple(outs)
    receives: dict[int, tuple[tuple[str, int], ...]] = {}
    extras: dict[int, tuple[str, ...]] = {}
    for st in split.stages:
        from_stages = [(n, s) for n, s in zip(st.inputs, st.sources, strict=True) if s >= 0]
        extra = [(n, s) for n, s in sent_to.get(st.index, []) if n not in st.inputs]
        receives[st.index] = tuple(from_stages + extra)
        extras[st.index] = tuple(n for n, _ in extra)
    placement = tuple(st.rank for st in sorted(split.stages, key=lambda st: st.index))
    return Routing(ranks, micro_batches, receives, extras, readers, edges, placement)
