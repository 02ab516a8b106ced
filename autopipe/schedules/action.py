"""A pipeline schedule as data: ``Action(stage, kind, microbatch)`` per step, per rank.

The representation follows ``torch.distributed.pipelining``: an action prints as ``1F0``
(stage 1, forward, micro-batch 0) and parses back; a schedule maps each rank to the ordered
list of actions it runs. ``None`` in a list is an idle slot; it only exists in hand-written
tables (to line columns up in tests and grids) and executors skip it.

``stage`` is the *virtual* stage (chunk) index ``j`` in ``[0, S * v)`` for ``S`` devices
(ranks) with ``v`` chunks each; which device runs chunk ``j`` is the schedule's placement
(:class:`~autopipe.schedules.spec.ScheduleSpec`; :func:`round_robin`, ``j % S``, unless the
schedule says otherwise). Kinds (:class:`Kind`, printed as their letter):

- ``F`` forward.
- ``B`` backward. The *full* backward (input-grad and weight-grad) when the schedule has no
  ``W`` for that (stage, micro-batch), the input-grad part only when it has one.
- ``W`` weight-grad part of a split backward (Zero Bubble PP, Qi et al. 2023).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from autopipe.errors import ScheduleError

__all__ = [
    "KINDS",
    "Action",
    "Kind",
    "Placement",
    "Schedule",
    "format_schedule",
    "has_split_backward",
    "parse_schedule",
    "round_robin",
    "to_table",
    "v_shape",
]


class Kind(str, Enum):
    """What an action computes; a ``str`` (``Kind.FORWARD == "F"``) that prints as its letter."""

    FORWARD = "F"
    BACKWARD = "B"  # full backward, or its input-grad part when the schedule has W
    WEIGHT = "W"  # weight-grad part of a split backward

    def __str__(self) -> str:
        return self.value


KINDS = tuple(k.value for k in Kind)  # ("F", "B", "W")
IDLE = "-"  # how an idle slot prints in grids and tables
_ACTION_RE = re.compile(r"^(\d+)([A-Za-z]+)(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    """One step of one rank: run ``kind`` of virtual ``stage`` on ``microbatch``."""

    stage: int  # virtual stage (chunk) index j in [0, S * v); the placement gives its device
    kind: Kind  # F forward, B backward (input-grad only if the schedule has W), W weight-grad
    microbatch: int  # micro-batch index in [0, m)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, Kind):
            if self.kind not in KINDS:
                raise ScheduleError(
                    f"action kind {self.kind!r} is unknown (stage {self.stage}, micro-batch "
                    f"{self.microbatch}); use one of F, B, W"
                )
            # A letter given as a plain str ("F", from a table) becomes its Kind.
            object.__setattr__(self, "kind", Kind(self.kind))
        if self.stage < 0 or self.microbatch < 0:
            raise ScheduleError(
                f"action {self.stage}{self.kind}{self.microbatch} has a negative index; "
                "stages and micro-batches count from 0"
            )

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @staticmethod
    def parse(text: str) -> Action | None:
        """``"1F0"`` -> ``Action(1, Kind.FORWARD, 0)``; ``""``, blanks or ``"-"`` -> ``None``
        (idle)."""
        token = text.strip()
        if token in ("", IDLE):
            return None
        match = _ACTION_RE.match(token)
        if match is None or match.group(2) not in KINDS:
            raise ScheduleError(
                f"cannot parse schedule action {text!r}; write <stage><F|B|W><micro-batch> "
                "like '1F0', or '-' for an idle slot"
            )
        return Action(int(match.group(1)), Kind(match.group(2)), int(match.group(3)))


Schedule = dict[int, list[Action | None]]
"""rank -> the actions it runs, in order (``None`` = idle slot, skipped by executors)."""


Placement = Callable[[int, int, int], int]
"""``placement(chunk, devices, virtual) -> device``: where a schedule runs chunk ``j``."""


def round_robin(chunk: int, devices: int, virtual: int = 1) -> int:
    """Chunk ``j`` on device ``j % S``: each device's chunks ``d, d + S, d + 2S, ...`` (the
    placement of GPipe, 1F1B, ZB-H1 and interleaved 1F1B)."""
    return chunk % devices


def v_shape(chunk: int, devices: int, virtual: int = 2) -> int:
    """Chunks in a V (a zigzag for ``virtual > 2``): chunk ``j < S`` on device ``j``, chunk
    ``2S-1-j`` back on device ``j``, so device ``d`` holds ``d`` and ``2S-1-d`` (the placement
    of ZB-V and the other V-shape schedules; Qi et al. 2024)::

        chunk   0 1 2 3 | 4 5 6 7      (S=4, v=2)
        device  0 1 2 3 | 3 2 1 0
    """
    lap, position = divmod(chunk, devices)
    return position if lap % 2 == 0 else devices - 1 - position


def parse_schedule(table: dict[int, list[str]]) -> Schedule:
    """``{0: ["0F0", " ", "0B0"]}`` -> a Schedule (blank or ``-`` cells are idle slots)."""
    return {rank: [Action.parse(cell) for cell in cells] for rank, cells in sorted(table.items())}


def to_table(schedule: Schedule) -> dict[int, list[str]]:
    """The inverse of :func:`parse_schedule`: actions as strings, idle slots as ``-``."""
    return {rank: [IDLE if a is None else str(a) for a in actions] for rank, actions in sorted(schedule.items())}


def has_split_backward(schedule: Schedule) -> bool:
    """Whether the schedule splits backward into B (input-grad) and W (weight-grad)."""
    return any(a is not None and a.kind is Kind.WEIGHT for actions in schedule.values() for a in actions)


def format_schedule(schedule: Schedule, mark: tuple[int, int] | None = None) -> str:
    """The schedule as a grid: one row per rank, one column per step.

    ``mark=(rank, step)`` draws that cell as ``>1B0<`` (used by error messages)::

        step    0    1    2    3
        rank 0  0F0  0F1  -    0B0
        rank 1  -   >1F0< 1B0  -
    """
    table = to_table(schedule)
    steps = max((len(cells) for cells in table.values()), default=0)
    width = max([len(c) for cells in table.values() for c in cells] + [len(str(steps - 1)), 1])
    label = max([len(f"rank {r}") for r in table] + [len("step")])

    def cell(text: str, marked: bool) -> str:
        return f">{text.ljust(width)}<" if marked else f" {text.ljust(width)} "

    header = "step".ljust(label) + " " + "".join(cell(str(i), False) for i in range(steps))
    lines = [header.rstrip()]
    for rank, cells in table.items():
        row = "".join(cell(c, mark == (rank, i)) for i, c in enumerate(cells))
        lines.append((f"rank {rank}".ljust(label) + " " + row).rstrip())
    if mark is not None and mark[0] not in table:
        lines.append(f"(marked step {mark[1]} is on rank {mark[0]}, which has no row)")
    return "\n".join(lines)
