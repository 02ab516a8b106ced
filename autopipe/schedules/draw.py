"""Pictures of a simulated schedule: a Gantt chart (PNG/SVG) and a compact text version.

One row per device; forward (F), backward (B, the input-gradient part when backward is split)
and weight-gradient (W) coloured per micro-batch (F light, B dark, W hatched); gaps are the
bubble; a thin band under each row shows activations and gradients in flight on the link into
that device. The title carries the predicted iteration time and bubble.
"""

from __future__ import annotations

import math
from pathlib import Path

from autopipe._io import atomic_write
from autopipe.errors import AutopipeError, PlanFileError
from autopipe.plans import Plan
from autopipe.schedules.registry import schedule_spec
from autopipe.schedules.simulate import Timeline

__all__ = ["MAX_DRAWN_MICRO_BATCHES", "check_times", "draw_timeline", "text_timeline"]

# Timelines of more micro-batches are not drawn: simulating and drawing every action grows with
# them (a million would take hours), and past a few hundred the picture shows nothing more.
MAX_DRAWN_MICRO_BATCHES = 1024
_TIMES = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")


def check_times(plan: Plan, source: str = "the plan") -> None:
    """PlanFileError unless every time the timeline is simulated from is a finite number >= 0
    (and the link bandwidth positive): a hand-edited plan cannot be drawn otherwise."""
    for st in plan.stages:
        for name in _TIMES:
            value = getattr(st, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise PlanFileError(f"{source}: stage {st.index} has {name} {value!r}; times must be zero or more, plan again")
    for name in ("link_latency_s", "action_overhead_s"):
        value = getattr(plan, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise PlanFileError(f"{source} has {name} {value!r}; times must be zero or more, plan again")
    if not (isinstance(plan.link_bandwidth, (int, float)) and plan.link_bandwidth > 0):
        raise PlanFileError(f"{source} has link_bandwidth {plan.link_bandwidth!r}; it must be positive, plan again")


def draw_timeline(plan: Plan, timeline: Timeline, path: str | Path) -> None:
    """Write the Gantt chart of ``timeline`` to ``path`` (.png or .svg)."""
    p = Path(path)
    if p.suffix.lower() not in (".png", ".svg"):
        raise AutopipeError(f"--timeline {p}: use a .png or .svg file name")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise AutopipeError("drawing a timeline needs matplotlib; pip install matplotlib") from None

    S, m = plan.devices, plan.micro_batches
    scale, unit = (1e3, "ms") if timeline.iteration_s < 10 else (1.0, "s")
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(min(24, 6 + 0.12 * len(timeline.actions) / max(S, 1)), 0.9 * S + 1.6))
    comm = _comm_by_stage(plan)
    spec = schedule_spec(plan.schedule)
    for at in timeline.actions:
        a = at.action
        y = S - 1 - at.rank
        colour = cmap((2 * a.microbatch) % 20 + (0 if a.kind == "F" else 1))
        ax.barh(
            y + 0.1, (at.end_s - at.start_s) * scale, left=at.start_s * scale, height=0.7,
            color=colour, edgecolor="black", linewidth=0.3, hatch="//" if a.kind == "W" else None,
        )  # fmt: skip
        width = (at.end_s - at.start_s) * scale
        if width > 0.025 * timeline.iteration_s * scale:
            ax.text(at.start_s * scale + width / 2, y + 0.45, f"{a.kind}{a.microbatch}", ha="center", va="center", fontsize=6)
        delay = comm.get((a.stage, a.kind), 0.0)
        if delay > 0:  # this action's output travels to the neighbour stage for ``delay`` seconds
            target = (a.stage + 1) if a.kind == "F" else (a.stage - 1)
            ty = S - 1 - spec.device_of(target, S, plan.virtual)
            ax.barh(ty - 0.32, delay * scale, left=at.end_s * scale, height=0.12, color="grey", alpha=0.6)
    ax.set_yticks(range(S), [f"device {S - 1 - y}" for y in range(S)])
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, timeline.iteration_s * scale * 1.01)
    ax.set_title(
        f"{plan.schedule}, {S} devices x {plan.virtual}, m={m}: predicted iteration "
        f"{timeline.iteration_s * scale:.3g} {unit}, bubble {timeline.bubble_fraction:.1%}",
        fontsize=10,
    )
    ax.legend(
        handles=[
            Patch(facecolor=cmap(0), edgecolor="black", label="F (forward)"),
            Patch(facecolor=cmap(1), edgecolor="black", label="B (backward)"),
            Patch(facecolor=cmap(1), edgecolor="black", hatch="//", label="W (weight grad)"),
            Patch(facecolor="grey", alpha=0.6, label="in flight on the link"),
        ],
        loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=8, frameon=False,
    )  # fmt: skip
    fig.tight_layout()
    try:
        atomic_write(p, lambda tmp: fig.savefig(tmp, dpi=120))
    finally:
        plt.close(fig)


def _comm_by_stage(plan: Plan) -> dict[tuple[int, str], float]:
    out: dict[tuple[int, str], float] = {}
    for s in plan.stages:
        if s.send_bytes > 0 and s.index + 1 < len(plan.stages):
            t = plan.link_latency_s + s.send_bytes / plan.link_bandwidth
            out[(s.index, "F")] = t
            out[(s.index + 1, "B")] = t
    return out


def text_timeline(plan: Plan, timeline: Timeline, width: int = 100) -> list[str]:
    """Rows of rich markup: one character per time slice, the micro-batch's digit coloured by
    kind (F green, B blue, W magenta), ``·`` idle."""
    total = timeline.iteration_s or 1.0
    rows = [["·"] * width for _ in range(plan.devices)]
    style = {"F": "green", "B": "blue", "W": "magenta"}
    for at in timeline.actions:
        a = at.action
        lo = int(at.start_s / total * width)
        hi = max(lo + 1, round(at.end_s / total * width))
        for c in range(lo, min(hi, width)):
            rows[at.rank][c] = f"[{style[a.kind]}]{a.microbatch % 10}[/]"
    return [f"device {r} │" + "".join(row) + "│" for r, row in enumerate(rows)]
