"""The result of a run: every rank's measurements, as values that survive JSON.

A bench reads these directly: per rank, per step, every action's start and end (seconds from
the rank's iteration start, which follows a barrier), the iteration's makespan and its full
step time (gradient sync and optimizer step included), the loss, and peak memory.

Tests: tests/runtime/run/test_report.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autopipe.runtime.engine import ActionRecord, IterationResult
from autopipe.runtime.run.worker import RankResult

__all__ = ["RunResult", "rank_from_dict", "rank_to_dict"]


def rank_to_dict(r: RankResult) -> dict[str, Any]:
    return asdict(r)


def rank_from_dict(d: dict[str, Any]) -> RankResult:
    its = tuple(
        IterationResult(**{**it, "records": tuple(ActionRecord(**a) for a in it["records"])}) for it in d["iterations"]
    )
    return RankResult(**{**d, "stages": tuple(d["stages"]), "iterations": its})


@dataclass(frozen=True)
class RunResult:
    ranks: tuple[RankResult, ...]  # by rank

    @property
    def steps(self) -> int:
        return len(self.ranks[0].iterations) if self.ranks else 0

    @property
    def losses(self) -> tuple[float, ...]:
        """The batch loss of every step (from the rank of the last stage)."""
        for r in self.ranks:
            if r.iterations and r.iterations[0].loss is not None:
                return tuple(float(it.loss) for it in r.iterations if it.loss is not None)
        return ()

    def makespans(self) -> tuple[float, ...]:
        """Per step: the slowest rank's end of its last action (the schedule's makespan)."""
        return tuple(max(r.iterations[k].makespan_s for r in self.ranks) for k in range(self.steps))

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": [rank_to_dict(r) for r in self.ranks]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> RunResult:
        return RunResult(tuple(rank_from_dict(r) for r in d["ranks"]))
