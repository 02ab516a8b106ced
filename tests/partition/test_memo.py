"""The memo types the kernels keep answers in (given by the caller; nothing at module level)."""

from __future__ import annotations

import dataclasses

from autopipe.partition import Edge, PartitionProblem, evaluate, solve_chain
from autopipe.partition.memo import BlockMemo, Recent


def test_a_kept_answer_is_found_by_the_same_objects_and_an_equal_value() -> None:
    recent: Recent[str] = Recent(2)
    a = (1.0, 2.0)
    b = tuple(list(a))
    assert recent.put((a,), (3,), "hit") == "hit"
    assert recent.get((a,), (3,)) == "hit"
    assert recent.get((b,), (3,)) is None  # equal but another object
    assert recent.get((a,), (4,)) is None
    assert recent.get((a, a), (3,)) is None


def test_only_the_newest_answers_are_kept() -> None:
    recent: Recent[int] = Recent(2)
    keys = [(object(),) for _ in range(3)]
    for k, key in enumerate(keys):
        recent.put(key, (), k)
    assert [recent.get(key) for key in keys] == [None, 1, 2]


def _problem(memo: BlockMemo | None, scale: float = 1.0) -> PartitionProblem:
    n, S = 12, 3
    return PartitionProblem(
        time_s=tuple(scale * (1.0 + (i % 4)) for i in range(n)),
        recompute_s=tuple(0.3 * (1.0 + (i % 4)) for i in range(n)),
        static_bytes=(10.0,) * n,
        activation_bytes=tuple(5.0 + i for i in range(n)),
        tensors=tuple(Edge(i, (i + 1,), 2.0) for i in range(n - 1)),
        stages=S,
        inflight=(3.0, 2.0, 1.0),
        stage_memory_limit=(400.0,) * S,
        memo=memo,
    )


def test_a_memo_serves_only_the_blocks_it_first_served_and_changes_nothing() -> None:
    memo = BlockMemo()
    p = _problem(memo)
    assert memo.owns(p) and memo.checked
    assert solve_chain(p) == solve_chain(_problem(None))
    assert memo.chain  # kept for the next problem on these blocks
    other = dataclasses.replace(p, time_s=tuple(2 * t for t in p.time_s))  # the memo travels along ...
    assert not memo.owns(other)  # ... but does not serve other blocks
    assert solve_chain(other) == solve_chain(_problem(None, scale=2.0))
    assert evaluate(other, solve_chain(other).stage_of_block) == evaluate(
        _problem(None, 2.0), solve_chain(other).stage_of_block
    )
    assert p == _problem(None)  # the memo is not part of the problem
