"""What a timeline picture shows, as plain numbers: the time windows drawn, the boxes in them,
and each device's memory over the iteration. No drawing library here (:mod:`.draw` draws).

A long schedule (more than :data:`FULL_DETAIL` actions on some device) is not drawn whole:
the warm-up, one steady-state window and the cool-down are drawn at full detail, and each
gap between them is marked with the number of actions it elides::

    device 0 │F0 F1 F2 F3 B0 F4 B1│≈ 2,900 ≈│F9 B8 F10 B9│≈ 2,900 ≈│B1532 B1533 B1534 B1535│

so the work of a picture is bounded by the picture (about ``3 * WINDOW_ACTIONS`` actions per
device), not by devices x micro-batches. The drawn axis ("x") runs through the windows one after
the other, each elision mark ``gap`` wide.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from autopipe.schedules.action import Action, Kind, round_robin, v_shape
from autopipe.simulate.events import ActionTiming, StageCost, Timeline

__all__ = [
    "FULL_DETAIL",
    "WINDOW_ACTIONS",
    "Box",
    "Frame",
    "Window",
    "device_chunks",
    "frame",
    "memory_steps",
    "pair_spans",
    "placement_shape",
    "placement_words",
    "sample",
]

FULL_DETAIL = 360  # actions per device drawn whole; past it, three windows
WINDOW_ACTIONS = 120  # actions per device in the warm-up and in the cool-down window
RECOMPUTE = "R"  # the part of a B that recomputes the forward (a stage with recompute)


@dataclass(frozen=True)
class Window:
    start_s: float  # simulated time
    end_s: float
    x0: float  # where the window starts on the drawn axis


@dataclass(frozen=True)
class Box:
    rank: int
    stage: int  # virtual stage
    x0: float  # drawn axis
    x1: float
    kind: str  # F, B, W or R (recompute, the first part of a B)
    microbatch: int
    chunk: int  # which of the device's stages (0 .. v-1)
    start_s: float  # the action's simulated start and end
    end_s: float


@dataclass(frozen=True)
class Frame:
    windows: tuple[Window, ...]
    gap: float  # drawn width of each elision mark between windows
    elided: tuple[int, ...]  # actions (all devices) not drawn, per gap
    boxes: tuple[Box, ...]
    width: float  # length of the drawn axis
    # overlapped F&B pairs (DualPipeV), drawn with a bar above them: (rank, x0, x1) on the axis
    pairs: tuple[tuple[int, float, float], ...] = ()

    def x_of(self, t: float) -> float | None:
        """Where simulated time ``t`` lies on the drawn axis; ``None`` inside an elided gap."""
        for w in self.windows:
            if w.start_s <= t <= w.end_s:
                return w.x0 + t - w.start_s
        return None


def _windows(per_rank: list[list[ActionTiming]], total: float) -> list[tuple[float, float]]:
    """The spans of simulated time to draw: everything, or warm-up, steady state, cool-down."""
    if max(len(r) for r in per_rank) <= FULL_DETAIL:
        return [(0.0, total)]
    k = WINDOW_ACTIONS
    warm = max(r[min(k, len(r)) - 1].end_s for r in per_rank if r)
    cool = min(r[max(len(r) - k, 0)].start_s for r in per_rank if r)
    if warm >= cool:
        return [(0.0, total)]
    pace = max((r[-1].end_s - r[0].start_s) / len(r) for r in per_rank if r)  # a busy device's
    mid = (warm + cool) / 2
    lo, hi = max(warm, mid - pace * k / 4), min(cool, mid + pace * k / 4)
    merged = [(0.0, warm)]
    for a, b in ((lo, hi), (cool, total)):
        if a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        elif b > a:
            merged.append((a, b))
    return merged


def frame(
    timeline: Timeline,
    devices: int,
    chunk_of: Sequence[int],
    recompute_s: Sequence[float] = (),
    gap_fraction: float = 0.04,
) -> Frame:
    """The boxes to draw for ``timeline`` (``chunk_of[j]``: the chunk number of stage ``j`` on
    its device; ``recompute_s[j]``: how much of stage ``j``'s B recomputes the forward). Only
    the drawn actions are visited (each device's actions run one after another, so a window
    is an index range of them)."""
    per_rank: list[list[ActionTiming]] = [[] for _ in range(devices)]
    for at in timeline.actions:
        per_rank[at.rank].append(at)
    spans = _windows(per_rank, timeline.iteration_s)
    drawn = sum(b - a for a, b in spans)
    gap = gap_fraction * drawn if len(spans) > 1 else 0.0
    windows, x = [], 0.0
    for a, b in spans:
        windows.append(Window(a, b, x))
        x += (b - a) + gap
    elided = [0] * (len(windows) - 1)
    boxes: list[Box] = []
    for acts in per_rank:
        starts = [at.start_s for at in acts]
        ends = [at.end_s for at in acts]
        ranges = [(bisect.bisect_left(ends, w.start_s), bisect.bisect_right(starts, w.end_s)) for w in windows]
        for i in range(len(windows) - 1):
            elided[i] += max(0, ranges[i + 1][0] - ranges[i][1])
        for w, (lo, hi) in zip(windows, ranges, strict=True):
            for at in acts[lo:hi]:
                boxes.extend(_boxes_of(at, w, chunk_of, recompute_s))
    return Frame(tuple(windows), gap, tuple(elided), tuple(boxes), x - gap)


def _boxes_of(at: ActionTiming, w: Window, chunk_of: Sequence[int], recompute_s: Sequence[float]) -> list[Box]:
    """``at`` clipped to window ``w``; a B that recomputes as two boxes (R, then B)."""
    a = at.action
    parts = [(at.start_s, at.end_s, a.kind.value)]
    r = recompute_s[a.stage] if recompute_s else 0.0
    if r > 0 and a.kind is Kind.BACKWARD:
        cut = min(at.start_s + r, at.end_s)
        parts = [(at.start_s, cut, RECOMPUTE), (cut, at.end_s, a.kind.value)]
    out = []
    for lo, hi, kind in parts:
        s, e = max(lo, w.start_s), min(hi, w.end_s)
        if e >= s:
            out.append(
                Box(
                    at.rank,
                    a.stage,
                    w.x0 + s - w.start_s,
                    w.x0 + e - w.start_s,
                    kind,
                    a.microbatch,
                    chunk_of[a.stage],
                    at.start_s,
                    at.end_s,
                )
            )
    return out


def pair_spans(f: Frame, pairs: Sequence[Sequence[tuple[Action, Action]]]) -> tuple[tuple[int, float, float], ...]:
    """Where each overlapped pair ``(F, B)`` of rank ``r`` (``pairs[r]``) lies on the drawn axis:
    ``(r, x0, x1)`` from the start of its F to the end of its B (a recomputing B's R included),
    for the pairs drawn whole in one window (none across an elision mark)."""
    spans: dict[tuple[int, int, str, int], tuple[float, float]] = {}
    for b in f.boxes:
        kind = Kind.BACKWARD.value if b.kind == RECOMPUTE else b.kind
        key = (b.rank, b.stage, kind, b.microbatch)
        lo, hi = spans.get(key, (b.x0, b.x1))
        spans[key] = (min(lo, b.x0), max(hi, b.x1))
    ends = [w.x0 + w.end_s - w.start_s for w in f.windows]
    out = []
    for rank, mine in enumerate(pairs):
        for fwd, bwd in mine:
            first = spans.get((rank, fwd.stage, fwd.kind.value, fwd.microbatch))
            last = spans.get((rank, bwd.stage, bwd.kind.value, bwd.microbatch))
            if first and last and bisect.bisect_left(ends, first[0]) == bisect.bisect_left(ends, last[1]):
                out.append((rank, first[0], last[1]))
    return tuple(out)


def memory_steps(
    timeline: Timeline, costs: Sequence[StageCost], home: Sequence[int]
) -> tuple[tuple[tuple[float, float], ...], ...]:
    """Per device, ``(time, bytes held from then on)`` at every change, with the simulator's
    accounting (:func:`~autopipe.simulate.events.simulate`): the device's static bytes, plus
    activations from the end of each F until its B frees them (all but the weight-grad bytes
    when backward is split; W frees those), plus the transient bytes while a B runs. The
    largest value of each device is its ``timeline.peak_memory_bytes``."""
    devices = len(timeline.peak_memory_bytes)
    split = {(at.action.stage, at.action.microbatch) for at in timeline.actions if at.action.kind is Kind.WEIGHT}
    held = [sum(c.static_bytes for j, c in enumerate(costs) if home[j] == d) for d in range(devices)]
    steps: list[list[tuple[float, float]]] = [[(0.0, h)] for h in held]
    for at in timeline.actions:
        a, d = at.action, at.rank
        c = costs[a.stage]
        if a.kind is Kind.FORWARD:
            held[d] += c.activation_bytes
        elif a.kind is Kind.BACKWARD:
            if c.transient_bytes:
                steps[d].append((at.start_s, held[d] + c.transient_bytes))
            held[d] -= c.activation_bytes - (c.weight_grad_bytes if (a.stage, a.microbatch) in split else 0.0)
        else:
            held[d] -= c.weight_grad_bytes
        steps[d].append((at.end_s, held[d]))
    return tuple(tuple(s) for s in steps)


def sample(f: Frame, steps: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """One device's memory steps on the drawn axis: ``(x, bytes)`` points of a step line (held
    from x on), each window opening with the value held at its start; changes in gaps elided."""
    times = [t for t, _ in steps]
    out: list[tuple[float, float]] = []
    for w in f.windows:
        i = bisect.bisect_right(times, w.start_s) - 1
        out.append((w.x0, steps[max(i, 0)][1]))
        j = i + 1
        while j < len(steps) and times[j] <= w.end_s:
            out.append((w.x0 + times[j] - w.start_s, steps[j][1]))
            j += 1
        out.append((w.x0 + w.end_s - w.start_s, out[-1][1]))
    return out


def device_chunks(ranks: Sequence[int], devices: int) -> tuple[tuple[int, ...], ...]:
    """Per device, the chunks (virtual stages) it runs, in chunk order; ``ranks[j]`` is the
    device of chunk ``j`` (a plan's ``stages[j].rank``)."""
    chunks: list[list[int]] = [[] for _ in range(devices)]
    for j, d in enumerate(ranks):
        chunks[d].append(j)
    return tuple(tuple(c) for c in chunks)


def placement_shape(ranks: Sequence[int], devices: int) -> str:
    """How the chunks lie on the devices, read from where they are: ``"one chunk per device"``,
    ``"V"`` (chunk ``j`` and ``2S-1-j`` on device ``j``), ``"zigzag"`` (a V of more than two
    chunks per device), ``"round-robin"`` (chunk ``j`` on device ``j % S``) or ``"other"``."""
    n, S = len(ranks), devices
    if n == S:
        return "one chunk per device"
    v = max(1, n // max(S, 1))
    if S > 1 and all(d == v_shape(j, S, v) for j, d in enumerate(ranks)):
        return "V" if v == 2 else "zigzag"
    if all(d == round_robin(j, S, v) for j, d in enumerate(ranks)):
        return "round-robin"
    return "other"


def _and(items: Sequence[int]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def placement_words(ranks: Sequence[int], devices: int, most: int = 6) -> str | None:
    """One line saying which chunks each device runs, for a plan of more than one chunk per
    device (``None`` otherwise); past ``most`` devices the middle ones are elided::

        V placement: device 0 runs chunks 0 and 7, device 1 runs 1 and 6, device 2 runs 2 and 5,
        device 3 runs 3 and 4 (down the V on chunks 0-3, back up on 4-7)
    """
    shape = placement_shape(ranks, devices)
    if shape == "one chunk per device":
        return None
    chunks = device_chunks(ranks, devices)
    shown = list(range(devices)) if devices <= most else [*range(most - 1), -1, devices - 1]
    parts = ["…" if d < 0 else f"device {d} runs {'chunks ' if d == 0 else ''}{_and(chunks[d])}" for d in shown]
    n, S = len(ranks), devices
    why = {
        "V": f" (down the V on chunks 0-{S - 1}, back up on {S}-{n - 1}: the first and the last chunk on device 0)",
        "zigzag": f" (down and up in turn, {S} chunks a leg)",
        "round-robin": f" (chunk j on device j mod {S})",
        "other": "",
    }[shape]
    return f"{shape} placement: " + ", ".join(parts) + why
