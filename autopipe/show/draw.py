"""Pictures of a simulated schedule: a Gantt chart (PNG/SVG) and a compact text version.

The chart has two panels. Above, one row per device: forward (F), backward (B, the
input-gradient part when backward is split), weight-gradient (W) and the recomputed forward
that opens a B on a stage with recomputation (R), each kind in its own colour (:data:`COLOURS`,
the legend's), the micro-batch number written where it fits; in a plan of several chunks per
device each row is labelled with its chunks and the chunks of every second lap round the devices
(a V's up leg, chunks ``S..2S-1``; an interleaved plan's second lap) are lighter and outlined,
as the legend says (the text version writes their letters in lower case); every action at
least :data:`MIN_PX` pixels wide; the light grey behind is idle time, the thin grey band
under a row activations or gradients in flight on the link into that device, a red bar
above a row an overlapped forward-and-backward pair (DualPipeV's F&B, the schedule's
``overlapped``). Below, each device's memory over the iteration as a fraction of its
limit (dashed line), so the stages that had to recompute show why. Long schedules are drawn as
warm-up, steady state and cool-down with the elided middle marked (:mod:`.picture`): the
picture and the time to draw it stay bounded (at most :data:`MAX_PX` pixels on a side).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopipe._io import atomic_write
from autopipe.errors import AutopipeError, OutputError, PlanFileError
from autopipe.plans import Plan
from autopipe.schedules.registry import schedule_spec
from autopipe.show.picture import (
    RECOMPUTE,
    Box,
    Frame,
    device_chunks,
    frame,
    memory_steps,
    pair_spans,
    placement_shape,
    sample,
)
from autopipe.simulate.events import StageCost, Timeline

__all__ = [
    "COLOURS",
    "IDLE_COLOUR",
    "MAX_DRAWN_ACTIONS",
    "MAX_PX",
    "PAIR_COLOUR",
    "Canvas",
    "check_times",
    "draw_timeline",
    "plan_frame",
    "second_laps",
    "text_timeline",
    "too_many_actions",
]

COLOURS = {"F": "#59a14f", "B": "#4e79a7", "W": "#b07aa1", RECOMPUTE: "#f28e2b"}  # by kind
NAMES = {"F": "F forward", "B": "B backward", "W": "W weight grad", RECOMPUTE: "R recompute (in B)"}
IDLE_COLOUR, LINK_COLOUR, LIMIT_COLOUR = "#e8e8e8", "#8c8c8c", "#d62728"
PAIR_COLOUR = "#e15759"  # the bar over an overlapped F&B pair (DualPipeV)
MAX_PX = 3000  # longest side of a drawn picture
MIN_PX = 3.0  # narrowest drawn action
_DPI = 100
_MAX_LABELS = 1500
_TIMES = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
MAX_DRAWN_ACTIONS = 400_000
"""The most actions a timeline is simulated for (a few seconds and a few hundred MB on a laptop core):
a picture of more would take minutes and gigabytes to show what its numbers already say."""


def too_many_actions(plan: Plan) -> str | None:
    """Why ``plan``'s timeline is not drawn (its actions, at most three per chunk and micro-batch, beyond
    :data:`MAX_DRAWN_ACTIONS`), or None when it is."""
    actions = 3 * len(plan.stages) * plan.micro_batches
    if actions <= MAX_DRAWN_ACTIONS:
        return None
    return (
        f"the plan has up to {actions:,} actions ({len(plan.stages)} chunks x {plan.micro_batches} "
        f"micro-batches x F, B, W), more than autopipe draws ({MAX_DRAWN_ACTIONS:,})"
    )


def check_times(plan: Plan, source: str = "the plan") -> None:
    """PlanFileError unless every time the timeline is simulated from is a finite number >= 0
    (and the link bandwidth positive): a hand-edited plan cannot be drawn otherwise."""
    for st in plan.stages:
        for name in _TIMES:
            value = getattr(st, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise PlanFileError(
                    f"{source}: stage {st.index} has {name} {value!r}; times must be zero or more, plan again"
                )
    for name in ("link_latency_s", "action_overhead_s", "send_overhead_s"):
        value = getattr(plan, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise PlanFileError(f"{source} has {name} {value!r}; times must be zero or more, plan again")
    if not (isinstance(plan.link_bandwidth, (int, float)) and plan.link_bandwidth > 0):
        raise PlanFileError(f"{source} has link_bandwidth {plan.link_bandwidth!r}; it must be positive, plan again")


def plan_frame(plan: Plan, timeline: Timeline) -> Frame:
    """The windows and boxes of ``plan``'s timeline (chunks numbered per device, the recomputed
    forward of a stage with recomputation as its own kind)."""
    chunk, seen = [], [0] * plan.devices
    for d in _home(plan):
        chunk.append(seen[d])
        seen[d] += 1
    recompute = [s.forward_s if s.recompute else 0.0 for s in plan.stages]
    f = frame(timeline, plan.devices, chunk, recompute)
    overlapped = schedule_spec(plan.schedule).overlapped
    if overlapped is None:
        return f
    pairs = [overlapped(r, plan.devices, plan.micro_batches) for r in range(plan.devices)]
    return dataclasses.replace(f, pairs=pair_spans(f, pairs))


@dataclass(frozen=True)
class Canvas:
    """Where the parts of a drawn timeline lie, in pixels (what :func:`draw_timeline` returns)."""

    width: int
    height: int
    row: int  # height of a device's row in the timeline panel
    mem: int  # ... and in the memory panel
    devices: int
    axis: float  # length of the drawn axis (Frame.width)
    left: int = 130
    right: int = 30
    top: int = 60
    bottom: int = 130
    between: int = 70

    @staticmethod
    def fit(devices: int, per_device: int, axis: float) -> Canvas:
        """Rows as tall as fit in :data:`MAX_PX` (every one visible at 64 devices), about 9 px
        per drawn action across."""
        row = int(min(36, max(14, 1400 / devices)))
        mem = int(min(24, max(10, 0.6 * row)))
        width = int(min(MAX_PX - 200, max(1000, 9 * per_device)))
        return Canvas(width, devices * (row + mem) + 330, row, mem, devices, axis)

    def panels(self) -> tuple[tuple[float, float, float, float], tuple[float, float, float, float]]:
        """The timeline's and the memory panel's axes, as figure fractions (left, bottom, w, h)."""
        panel = self.height - self.top - self.bottom - self.between
        upper, lower = panel * self.row / (self.row + self.mem), panel * self.mem / (self.row + self.mem)
        w = 1 - (self.left + self.right) / self.width
        return (self.left / self.width, (self.bottom + self.between + lower) / self.height, w, upper / self.height), (
            self.left / self.width,
            self.bottom / self.height,
            w,
            lower / self.height,
        )

    def pixel(self, x: float, y: float, memory: bool = False) -> tuple[int, int]:
        """The pixel (column, row from the top) of point ``(x, y)`` of a panel (``y``: device
        ``d``'s row is centred on ``devices - 1 - d``)."""
        left, bottom, w, h = self.panels()[1 if memory else 0]
        fx = left + w * x / max(self.axis, 1e-300)
        fy = bottom + h * (y + 0.6) / (self.devices + 0.2)  # the y limits: -0.6 .. devices - 0.4
        return int(fx * self.width), int((1 - fy) * self.height)


def draw_timeline(
    plan: Plan, timeline: Timeline, path: str | Path, costs: list[StageCost] | None = None, shown: Frame | None = None
) -> Canvas:
    """Write the Gantt chart of ``timeline`` to ``path`` (.png or .svg) and say where its parts are; ``costs``
    (the stage costs it was simulated with) add the memory panel; ``shown`` is :func:`plan_frame`'s, if made already."""
    p = Path(path)
    if p.suffix.lower() not in (".png", ".svg"):
        raise OutputError(f"--timeline {p}: use a .png or .svg file name")
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, faster to import
    except ImportError:
        raise AutopipeError("drawing a timeline needs matplotlib; pip install matplotlib") from None
    f = shown if shown is not None else plan_frame(plan, timeline)
    S = plan.devices
    per_device = max(sum(1 for b in f.boxes if b.rank == d) for d in range(S))
    canvas = Canvas.fit(S, per_device, f.width)
    width, row = canvas.width, canvas.row
    fig = Figure(figsize=(width / _DPI, canvas.height / _DPI), dpi=_DPI)
    upper, lower = canvas.panels()
    ax = fig.add_axes(upper)
    scale, unit = (1e3, "ms") if timeline.iteration_s < 10 else (1.0, "s")
    px = width * upper[2] / max(f.width, 1e-300)  # pixels per second of drawn axis
    _boxes(ax, plan, f, px, row)
    _axes(ax, f, S, scale, unit, _row_names(plan, row))
    elided = f" (warm-up, steady state and cool-down; {sum(f.elided):,} actions elided)" if f.elided else ""
    ax.set_title(
        f"{plan.schedule}, {S} devices x {plan.virtual}{_shape_words(plan)}, m={plan.micro_batches}: "
        "predicted iteration "
        f"{timeline.iteration_s * scale:.4g} {unit}, bubble {timeline.bubble_fraction:.1%}{elided}",
        fontsize=10,
    )
    if costs is not None:
        ax2 = fig.add_axes(lower)
        _memory(ax2, plan, timeline, f, costs)
    _legend(fig, plan, f)
    atomic_write(p, lambda tmp: fig.savefig(tmp, dpi=_DPI, format=p.suffix.lower()[1:]))
    return canvas


def _lighter(colour: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return (r + (1 - r) * 0.5, g + (1 - g) * 0.5, b + (1 - b) * 0.5)


def _rect(x0: float, x1: float, y0: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def _shapes(
    ax: Any, polygons: list[list[tuple[float, float]]], face: Any, edge: Any = "none", width: float = 0.0, **kw: Any
) -> None:
    """All ``polygons`` as one compound path: one artist however many (fast to draw)."""
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path as MplPath

    if not polygons:
        return
    verts: list[tuple[float, float]] = []
    codes: list[int] = []
    move, line, close = int(MplPath.MOVETO), int(MplPath.LINETO), int(MplPath.CLOSEPOLY)
    for poly in polygons:
        verts += [*poly, poly[0]]
        codes += [move] + [line] * (len(poly) - 1) + [close]
    patch = PathPatch(MplPath(verts, codes), facecolor=face, edgecolor=edge, linewidth=width, antialiased=False, **kw)
    ax.add_artist(patch)  # not add_patch: the limits are set, and walking 100,000 corners for them is slow


def _boxes(ax: Any, plan: Plan, f: Frame, px: float, row: int) -> None:
    S = plan.devices
    _shapes(ax, [_rect(0, f.width, S - 1 - d - 0.42, S - 1 - d + 0.3) for d in range(S)], IDLE_COLOUR)
    least = MIN_PX / px
    # (widened to show?, odd chunk?, kind) -> rectangles; the widened ones drawn last, on top
    groups: dict[tuple[bool, bool, str], list[list[tuple[float, float]]]] = {}
    link: list[list[tuple[float, float]]] = []
    spec = schedule_spec(plan.schedule)
    labels = 0
    fontsize = min(8.0, 0.4 * row)
    for b in f.boxes:
        y = S - 1 - b.rank
        x1 = max(b.x1, b.x0 + least)
        groups.setdefault((x1 > b.x1, b.chunk % 2 == 1, b.kind), []).append(_rect(b.x0, x1, y - 0.42, y + 0.3))
        if (
            b.kind != RECOMPUTE
            and labels < _MAX_LABELS
            and (x1 - b.x0) * px >= 6.5 * len(str(b.microbatch)) + 4
            and row >= 14
        ):
            ax.text(
                (b.x0 + x1) / 2,
                y - 0.06,
                str(b.microbatch),
                ha="center",
                va="center",
                fontsize=fontsize,
                color="white" if b.chunk % 2 == 0 else "black",
            )
            labels += 1
        delay, to = _link(plan, b.stage, b.kind)
        end = f.x_of(b.end_s) if delay > 0 else None
        if end is not None and b.x1 == end:  # the box that ends the action
            ty = S - 1 - spec.device_of(to, S, plan.virtual)
            link.append(_rect(end, end + max(delay, least / 2), ty - 0.58, ty - 0.46))
    _shapes(ax, link, LINK_COLOUR)
    # an overlapped F&B pair: a bar above the row, from the F's start to the B's end
    _shapes(ax, [_rect(x0, x1, S - 1 - r + 0.32, S - 1 - r + 0.41) for r, x0, x1 in f.pairs], PAIR_COLOUR)
    for (narrow, odd, kind), rects in sorted(groups.items()):
        edge, width = ("none", 0.0) if narrow else ("black", 0.8) if odd else ("white", 0.6)
        _shapes(ax, rects, _lighter(COLOURS[kind]) if odd else COLOURS[kind], edge, width)


def _axes(ax: Any, f: Frame, rows: int, scale: float, unit: str, names: list[str]) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlim(0, f.width)
    ax.set_ylim(-0.6, rows - 0.4)
    ax.set_yticks(range(rows), list(reversed(names)), fontsize=min(9, max(6, 0.45 * 1400 / rows)))
    ticks: list[float] = []
    labels: list[str] = []
    for w in f.windows:
        bins = max(2, round(8 * (w.end_s - w.start_s) / max(f.width, 1e-300)))
        for t in MaxNLocator(nbins=bins).tick_values(w.start_s * scale, w.end_s * scale):
            if w.start_s * scale <= t <= w.end_s * scale:
                ticks.append(w.x0 + t / scale - w.start_s)
                labels.append(f"{t:g}")
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_xlabel(f"time ({unit})")
    for i, w in enumerate(f.windows[:-1]):
        lo = w.x0 + w.end_s - w.start_s
        ax.axvspan(lo, lo + f.gap, facecolor="white", edgecolor="black", hatch="\\\\", linewidth=0.5, zorder=3)
        if f.elided:
            ax.text(
                lo + f.gap / 2,
                (rows - 1) / 2,
                f"{f.elided[i]:,} actions elided",
                rotation=90,
                ha="center",
                va="center",
                fontsize=9,
                zorder=4,
                bbox={"facecolor": "white", "edgecolor": "none"},
            )


def _memory(ax: Any, plan: Plan, timeline: Timeline, f: Frame, costs: list[StageCost]) -> None:
    S = plan.devices
    home = schedule_spec(plan.schedule).devices_of(S, plan.virtual)
    steps = memory_steps(timeline, costs, home)
    limit = (
        plan.memory_limit_bytes
        if plan.memory_limit_bytes > 0 and math.isfinite(plan.memory_limit_bytes)
        else max(timeline.peak_memory_bytes) or 1.0
    )
    recomputes = {s.rank for s in plan.stages if s.recompute}
    names: list[str] = []
    areas: dict[bool, list[list[tuple[float, float]]]] = {True: [], False: []}
    for d in range(S):
        y0 = S - 1 - d - 0.4
        outline = [(0.0, y0)]
        for x, v in sample(f, steps[d]):  # a step line: held from x on
            y = y0 + 0.8 * min(v / limit, 1.05)
            outline += [(x, outline[-1][1]), (x, y)]
        outline.append((outline[-1][0], y0))
        areas[d in recomputes].append(outline)
        names.append(f"device {d}: {timeline.peak_memory_bytes[d] / limit:.0%}")
    for recomputing, shapes in areas.items():
        _shapes(ax, shapes, COLOURS[RECOMPUTE] if recomputing else COLOURS["B"], alpha=0.6)
    ax.hlines([S - 1 - d + 0.4 for d in range(S)], 0, f.width, colors=LIMIT_COLOUR, linewidth=0.7, linestyles="--")
    scale, unit = (1e3, "ms") if timeline.iteration_s < 10 else (1.0, "s")
    _axes(ax, f, S, scale, unit, names)
    ax.set_title("memory held over the iteration (peak / limit per device; orange: recomputes)", fontsize=9)


def _legend(fig: Any, plan: Plan, f: Frame) -> None:
    from matplotlib.patches import Patch

    kinds = {b.kind for b in f.boxes}
    handles = [Patch(facecolor=COLOURS[k], label=NAMES[k]) for k in ("F", "B", "W", RECOMPUTE) if k in kinds]
    lap = second_laps(plan)
    if lap:
        handles.append(Patch(facecolor=_lighter(COLOURS["F"]), edgecolor="black", label=f"{lap}: lighter, outlined"))
    if f.pairs:
        handles.append(Patch(facecolor=PAIR_COLOUR, label="bar above: F&B overlapped pair"))
    handles += [Patch(facecolor=IDLE_COLOUR, label="idle"), Patch(facecolor=LINK_COLOUR, label="in flight on the link")]
    ncol = len(handles) if len(handles) <= 6 else (len(handles) + 1) // 2  # two rows if wide
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=9, frameon=False)


def _home(plan: Plan) -> tuple[int, ...]:
    return schedule_spec(plan.schedule).devices_of(plan.devices, plan.virtual)


def _shape_words(plan: Plan) -> str:
    """`` chunks in a V`` (or a zigzag, round-robin) after "4 devices x 2" in the title."""
    shape = placement_shape(_home(plan), plan.devices)
    return {"V": " chunks in a V", "zigzag": " chunks in a zigzag", "round-robin": " chunks round-robin"}.get(shape, "")


def second_laps(plan: Plan) -> str | None:
    """Which chunks are drawn lighter (and written in lower case): each device's second, fourth
    ... chunk, the chunks of every second lap round the devices -- ``"chunks 4-7 (up the V)"`` for
    ZB-V on 4 devices, ``"chunks 2-3 and 6-7 (every second lap)"`` interleaved over 2 devices x 4;
    ``None`` for one chunk per device."""
    S, v = plan.devices, plan.virtual
    if v < 2:
        return None
    laps = [f"{k * S}-{(k + 1) * S - 1}" if S > 1 else str(k) for k in range(1, v, 2)]
    which = "chunk" + ("s" if S > 1 or len(laps) > 1 else "") + " " + " and ".join(laps)
    up = placement_shape(_home(plan), S) in ("V", "zigzag")
    return f"{which} ({'up the V' if up else 'every second lap'})"


def _row_names(plan: Plan, row: int) -> list[str]:
    """``device 0`` per row, and under it the device's chunks where there are several and the
    rows are tall enough for two lines."""
    S = plan.devices
    if plan.virtual < 2 or row < 28:
        return [f"device {d}" for d in range(S)]
    chunks = device_chunks(_home(plan), S)
    return [f"device {d}\nchunks {', '.join(map(str, chunks[d]))}" for d in range(S)]


def _link(plan: Plan, stage: int, kind: str) -> tuple[float, int]:
    """How long the output of ``kind`` of ``stage`` travels, and to which stage (0: not sent)."""
    to = stage + 1 if kind == "F" else stage - 1
    if kind not in ("F", "B") or not 0 <= to < len(plan.stages):
        return 0.0, to
    sent = plan.stages[min(stage, to)].send_bytes
    if sent <= 0 or schedule_spec(plan.schedule).device_of(to, plan.devices, plan.virtual) == schedule_spec(
        plan.schedule
    ).device_of(stage, plan.devices, plan.virtual):
        return 0.0, to
    return plan.link_latency_s + sent / plan.link_bandwidth, to


def text_timeline(
    plan: Plan, timeline: Timeline, width: int = 100, letters: bool = False, shown: Frame | None = None
) -> list[str]:
    """A heading and one row of rich markup per device, one character per slice of time: the
    micro-batch's last digit coloured by kind (F green, B blue, W magenta), or with ``letters``
    (for a file or a pipe, where colours are lost) the kind's letter; ``·`` idle, ``┊`` elided."""
    f = shown if shown is not None else plan_frame(plan, timeline)
    columns = width - (len(f.windows) - 1)
    style = {"F": "green", "B": "blue", "W": "magenta", RECOMPUTE: "blue"}
    per_rank: list[list[Box]] = [[] for _ in range(plan.devices)]
    for b in f.boxes:
        per_rank[b.rank].append(b)
    rows = []
    for boxes in per_rank:
        starts = [b.x0 for b in boxes]
        cells: list[str] = []
        for i, w in enumerate(f.windows):
            span = w.end_s - w.start_s
            n = max(1, round(columns * span / max(f.width - f.gap * (len(f.windows) - 1), 1e-300)))
            for c in range(n):
                hit = _busiest(boxes, starts, w.x0 + c * span / n, w.x0 + (c + 1) * span / n)
                if hit is None:
                    cells.append("·")
                else:
                    kind = "B" if hit.kind == RECOMPUTE else hit.kind
                    odd = hit.chunk % 2 == 1
                    text = (kind.lower() if odd else kind) if letters else str(hit.microbatch % 10)
                    cells.append(f"[{style[kind]}{' underline' if odd and not letters else ''}]{text}[/]")
            if i + 1 < len(f.windows):
                cells.append("┊")
        rows.append(cells)
    key = (
        "letter = kind: [green]F[/] forward, [blue]B[/] backward, [magenta]W[/] weight grad"
        if letters
        else "digit = micro-batch; [green]F[/] [blue]B[/] [magenta]W[/]"
    )
    lap = second_laps(plan)
    if lap:
        key += f"; {'lower case f b w' if letters else '[underline]underlined[/]'}: {lap}"
    head = [f"timeline ({key}, · idle):"]
    if f.elided:
        head.append(f"┊ {sum(f.elided):,} actions elided: warm-up, one steady-state window and cool-down shown")
    return head + [f"device {r} │" + "".join(row) + "│" for r, row in enumerate(rows)]


def _busiest(boxes: list[Box], starts: list[float], lo: float, hi: float) -> Box | None:
    """Of one device's boxes (by start), the one that covers most of ``[lo, hi)``; ``None`` if
    none reaches into it (a zero-length action counts where it stands)."""
    best, most = None, -1.0
    k = bisect.bisect_left(starts, hi)
    while k > 0:
        k -= 1
        b = boxes[k]
        if b.x1 < lo:
            break
        overlap = min(b.x1, hi) - max(b.x0, lo)
        if overlap > most and (b.x1 > lo or b.x0 == b.x1 == lo):
            best, most = b, overlap
    return best
