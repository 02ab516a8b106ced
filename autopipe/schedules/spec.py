"""Everything about one pipeline schedule, in one value: :class:`ScheduleSpec`.

Each schedule module (``gpipe.py``, ``one_f_one_b.py``, ``interleaved.py``, ``zb_h1.py``)
defines its ``SPEC`` next to its ``create_schedule``, and ``registry.py`` lists them. The
planner, the simulator, the drawing, the torch exporter and the executor read what they need
from the spec — its action lists, where each chunk runs, how many micro-batches of activations
a chunk holds, its textbook bubble, whether it splits the backward, its
``torch.distributed.pipelining`` class — and never compare schedule names.

Words: ``devices`` is the pipeline's device (rank) count ``S``; ``virtual`` the chunks per
device ``v``; a *chunk* (virtual stage) ``j`` is in ``[0, S * v)``; ``micro_batches`` is ``m``.

Tests: tests/schedules/test_registry.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autopipe.schedules.action import Action, Placement, Schedule, round_robin
from autopipe.schedules.lists import RankLists, from_schedule
from autopipe.schedules.validate import validate

__all__ = ["ScheduleSpec"]


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule: its name, its action lists and the facts the other steps rely on."""

    name: str  # the --schedule name and the plan's "schedule"
    create_schedule: Callable[[int, int, int], Schedule]  # (devices, micro_batches, virtual)
    inflight: Callable[[int, int, int], tuple[float, ...]]  # per chunk: micro-batches of activations it holds
    bubble: Callable[[int, int, int], float]  # textbook bubble fraction, equal stage times
    torch_class: str  # the torch.distributed.pipelining schedule class that runs it
    preference: int  # among equally fast plans the search takes the lowest (unique)
    torch_multi: bool = False  # that class takes a list of stages per rank (PipelineScheduleMulti)
    splits_backward: bool = False  # B (input-grad) and W (weight-grad) run apart (Zero Bubble)
    virtual_choices: tuple[int, ...] = (1,)  # chunks per device the search tries; (1,): one only
    micro_batches_multiple_of_devices: bool = False  # m % S == 0 (the planner asks it of any v)
    min_micro_batches_per_device: int = 0  # m >= this x S, fewer refused (DualPipeV: 2); 0: any m
    placement: Placement = round_robin  # (chunk, devices, virtual) -> device
    searched: bool = True  # the automatic search tries it; False: only when pinned (--schedule)
    # The same lists as integer arrays, built without Action objects (the planner's fast path);
    # None: derived from create_schedule.
    create_lists: Callable[[int, int, int], RankLists] | None = None
    # (rank, devices, micro_batches) -> that rank's overlapped F&B pairs, each F immediately
    # followed by its B in the list (DualPipeV; drawn in the pictures); None: no pairs.
    overlapped: Callable[[int, int, int], tuple[tuple[Action, Action], ...]] | None = None

    @property
    def takes_virtual(self) -> bool:
        """Whether the schedule runs more than one chunk per device."""
        return self.virtual_choices != (1,)

    def make(self, devices: int, micro_batches: int, virtual: int = 1) -> Schedule:
        """The validated action lists for ``devices``, ``micro_batches`` and ``virtual``."""
        schedule = self.create_schedule(devices, micro_batches, virtual)
        validate(schedule, devices, micro_batches, virtual, self.placement)
        return schedule

    def lists(self, devices: int, micro_batches: int, virtual: int = 1) -> RankLists:
        """The action lists as integer arrays (unvalidated, like ``create_schedule``'s), from
        ``create_lists`` when the schedule has one."""
        if self.create_lists is not None:
            return self.create_lists(devices, micro_batches, virtual)
        return from_schedule(self.create_schedule(devices, micro_batches, virtual), devices)

    def device_of(self, chunk: int, devices: int, virtual: int = 1) -> int:
        """The device that runs ``chunk``."""
        return self.placement(chunk, devices, virtual)

    def devices_of(self, devices: int, virtual: int = 1) -> tuple[int, ...]:
        """The device of every chunk ``0 .. devices * virtual - 1``."""
        return tuple(self.placement(j, devices, virtual) for j in range(devices * virtual))

    def least_micro_batches(self, devices: int) -> int:
        """The fewest micro-batches the schedule runs on ``devices`` (1 for most)."""
        return max(1, self.min_micro_batches_per_device * devices)

    def searchable(self, devices: int, micro_batches: int, virtual: int) -> bool:
        """Whether the search tries this schedule at these sizes: enough micro-batches for it
        (:meth:`least_micro_batches`); a schedule of several chunks per device needs more than
        one device to gain anything (and, if it says so, a micro-batch count that is a multiple
        of the devices)."""
        if micro_batches < self.least_micro_batches(devices):
            return False
        if not self.takes_virtual:
            return True
        if self.micro_batches_multiple_of_devices and micro_batches % devices:
            return False
        return devices > 1
