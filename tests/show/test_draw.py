"""The timeline pictures, looked at: colours per kind read back from the pixels at known
actions, chunks told apart, zero-length actions visible, the memory panel, the text version."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from autopipe.graph.recipe import TraceRecipe
from autopipe.planner.assemble import plan_costs, plan_timeline
from autopipe.plans import Plan, StagePlan
from autopipe.schedules.registry import schedule_spec
from autopipe.schedules.v_shapes import dualpipe_v
from autopipe.show.draw import (
    COLOURS,
    IDLE_COLOUR,
    PAIR_COLOUR,
    Canvas,
    draw_timeline,
    plan_frame,
    text_timeline,
)
from autopipe.show.picture import RECOMPUTE, Box

MS = 1e-3


def synthetic_plan(
    devices: int,
    micro_batches: int,
    schedule: str = "1f1b",
    virtual: int = 1,
    recompute: tuple[int, ...] = (),
    first_b: float = 2 * MS,
) -> Plan:
    """A plan without a model or a search (stages where ``schedule`` places them): stage j forwards in
    (1 + j/10) ms, backwards in 2 ms
    (``first_b`` on stage 0: its input-gradient B), recomputes where told, holds 1 GiB static."""
    n = devices * virtual
    stages = tuple(
        StagePlan(
            index=j,
            rank=schedule_spec(schedule).device_of(j, devices, virtual),
            blocks=(f"layers.{j}",),
            block_indices=(j,),
            nodes=(f"n{j}",),
            params=1000,
            forward_s=(1 + j / 10) * MS,
            backward_s=first_b + MS if j == 0 else 3 * MS,
            backward_input_s=first_b if j == 0 else 2 * MS,
            backward_weight_s=MS,
            recompute=j in recompute,
            memory_bytes=0.0,
            static_bytes=2.0**30,
            activation_bytes=2.0**28,
            held_bytes=2.0**24 if j in recompute else 2.0**28,
            send_bytes=2.0**20 if j + 1 < n else 0.0,
        )
        for j in range(n)
    )
    return Plan(
        model="synthetic",
        recipe=TraceRecipe(tracer="fx", fingerprint="fp"),
        profile_device="cpu",
        devices=devices,
        virtual=virtual,
        schedule=schedule,
        micro_batches=micro_batches,
        micro_batch_size=1,
        batch_size=micro_batches,
        memory_limit_bytes=4 * 2.0**30,
        link_bandwidth=25e9,
        link_latency_s=2e-5,
        recompute_policy="auto",
        stages=stages,
        iteration_time_s=1.0,
        bubble_fraction=0.1,
        throughput=1.0,
        peak_memory_bytes=(2.0**31,) * devices,
        alternatives=(),
        baselines=(),
    )


def draw(plan: Plan, path: Path) -> tuple[Canvas, Any, list[Box]]:
    timeline = plan_timeline(plan)
    canvas = draw_timeline(plan, timeline, path, plan_costs(plan))
    return canvas, imread(str(path)), list(plan_frame(plan, timeline).boxes)


def colour_at(canvas: Canvas, image: Any, box: Box, at: float = 0.3) -> tuple[float, float, float]:
    """The pixel a little into ``box``, above the micro-batch number written on it."""
    col, row = canvas.pixel(box.x0 + at * (box.x1 - box.x0), canvas.devices - 1 - box.rank + 0.2)
    r, g, b = image[row, col][:3]
    return (float(r), float(g), float(b))


def same(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    return all(abs(x - y) <= 1.5 / 255 for x, y in zip(a, b, strict=True))


def test_each_kind_has_its_colour_where_its_actions_are(tmp_path: Path) -> None:
    plan = synthetic_plan(4, 8, "zb-h1", recompute=(2,))
    canvas, image, boxes = draw(plan, tmp_path / "t.png")
    assert image.shape[:2] == (canvas.height, canvas.width) and max(image.shape[:2]) <= 3000
    for kind in ("F", "B", "W", RECOMPUTE):
        mine = [b for b in boxes if b.kind == kind and (b.x1 - b.x0) / canvas.axis * canvas.width > 12]
        assert len(mine) >= 4, kind
        for box in mine[:: max(1, len(mine) // 5)]:
            assert same(colour_at(canvas, image, box), to_rgb(COLOURS[kind])), (kind, box)
    first = min(b.x0 for b in boxes if b.rank == 3)  # device 3 waits for its first forward: idle
    col, row = canvas.pixel(first / 2, 0.2)
    assert same(tuple(float(v) for v in image[row, col][:3]), to_rgb(IDLE_COLOUR))  # type: ignore[arg-type]


def test_the_chunks_of_an_interleaved_plan_are_told_apart(tmp_path: Path) -> None:
    plan = synthetic_plan(2, 4, "interleaved-1f1b", virtual=2)
    canvas, image, boxes = draw(plan, tmp_path / "t.png")
    for chunk in (0, 1):
        for box in [b for b in boxes if b.chunk == chunk and b.kind == "F"]:
            want = to_rgb(COLOURS["F"])
            if chunk:  # lighter, and outlined
                want = tuple(c + (1 - c) * 0.5 for c in want)  # type: ignore[assignment]
            assert same(colour_at(canvas, image, box), want), box


def lighter(colour: str) -> tuple[float, float, float]:
    r, g, b = to_rgb(colour)
    return (r + (1 - r) * 0.5, g + (1 - g) * 0.5, b + (1 - b) * 0.5)


def test_a_zb_v_plan_is_drawn_as_a_v(tmp_path: Path) -> None:
    """Each device's row holds its down chunk d (full colour) and its up chunk 2S-1-d (lighter),
    read back from the pixels of every action wide enough to hold one."""
    plan = synthetic_plan(4, 8, "zb-v", virtual=2)
    canvas, image, boxes = draw(plan, tmp_path / "t.png")
    assert max(image.shape[:2]) <= 3000 and {(b.rank, b.stage) for b in boxes} == {
        (d, j) for d in range(4) for j in (d, 7 - d)
    }
    seen = {(b.stage, b.kind) for b in boxes}
    assert len(seen) == 8 * 3  # F, B and W of all eight chunks
    checked: set[tuple[int, str]] = set()
    for box in boxes:
        if (box.x1 - box.x0) / canvas.axis * canvas.width > 12:
            up = box.stage >= 4
            assert box.chunk == int(up)
            want = lighter(COLOURS[box.kind]) if up else to_rgb(COLOURS[box.kind])
            assert same(colour_at(canvas, image, box), want), box
            checked.add((box.stage, box.kind))
    assert checked == seen
    first_up = min((b for b in boxes if b.stage == 7), key=lambda b: b.x0)  # 7F0, on device 0 (the top row)
    col, row = canvas.pixel(first_up.x0 + 0.3 * (first_up.x1 - first_up.x0), 3 + 0.2)
    assert first_up.rank == 0 and same(tuple(float(v) for v in image[row, col][:3]), lighter(COLOURS["F"]))  # type: ignore[arg-type]


def test_the_text_timeline_of_a_v_writes_the_up_leg_in_lower_case() -> None:
    plan = synthetic_plan(4, 8, "zb-v", virtual=2)
    timeline = plan_timeline(plan)
    width = 300
    rows = text_timeline(plan, timeline, width=width, letters=True)
    assert "lower case f b w: chunks 4-7 (up the V)" in rows[0]
    grid = {int(r.split(" │")[0].split()[1]): re.sub(r"\[/?[a-z ]*\]", "", r.split("│")[1]) for r in rows[1:]}
    assert all(len(cells) == width for cells in grid.values())
    f = plan_frame(plan, timeline)
    read = 0
    for box in f.boxes:  # every action two columns wide or more, read back at its middle
        lo, hi = box.x0 / f.width * width, box.x1 / f.width * width
        if hi - lo >= 2:
            letter = grid[box.rank][int((lo + hi) / 2)]
            assert letter == (box.kind.lower() if box.stage >= 4 else box.kind), box
            read += 1
    assert read >= 100
    assert (
        "[green underline]" in "".join(text_timeline(plan, timeline))
        and "[underline]underlined[/]: chunks 4-7 (up the V)" in text_timeline(plan, timeline)[0]
    )


def test_the_overlapped_pairs_of_dualpipe_v_have_a_bar_above(tmp_path: Path) -> None:
    """Every F&B pair dualpipe_v.overlapped names gets a bar above its row, from its F's start
    to its B's end, read back from the pixels; the actions outside pairs and ZB-V get none."""
    plan = synthetic_plan(2, 6, "dualpipe-v", virtual=2)
    canvas, image, boxes = draw(plan, tmp_path / "t.png")
    f = plan_frame(plan, plan_timeline(plan))
    at = {(b.rank, b.stage, b.kind, b.microbatch): b for b in boxes}
    pairs = [(r, p) for r in range(2) for p in dualpipe_v.overlapped(r, 2, 6)]
    assert len(pairs) == 14 and len(f.pairs) == len(pairs)
    covered = set()
    for (r, (fwd, bwd)), (rank, x0, x1) in zip(pairs, f.pairs, strict=True):
        assert (rank, x0, x1) == (r, at[r, fwd.stage, "F", fwd.microbatch].x0, at[r, bwd.stage, "B", bwd.microbatch].x1)
        for x in (x0 + 0.1 * (x1 - x0), (x0 + x1) / 2, x1 - 0.1 * (x1 - x0)):
            col, row = canvas.pixel(x, 1 - r + 0.365)
            assert same(tuple(float(v) for v in image[row, col][:3]), to_rgb(PAIR_COLOUR)), (r, fwd, bwd)  # type: ignore[arg-type]
        covered |= {(r, round(x, 9)) for x in (x0, x1)}
    first = min((b for b in boxes if b.rank == 0), key=lambda b: b.x0)  # 0F0: not in a pair
    col, row = canvas.pixel((first.x0 + first.x1) / 2, 1 + 0.365)
    assert not same(tuple(float(v) for v in image[row, col][:3]), to_rgb(PAIR_COLOUR))  # type: ignore[arg-type]
    assert (
        plan_frame(
            synthetic_plan(2, 6, "zb-v", virtual=2), plan_timeline(synthetic_plan(2, 6, "zb-v", virtual=2))
        ).pairs
        == ()
    )


def test_a_zero_length_action_is_still_seen(tmp_path: Path) -> None:
    plan = synthetic_plan(2, 4, "zb-h1", first_b=0.0)  # stage 0's input-gradient B takes no time
    canvas, image, boxes = draw(plan, tmp_path / "t.png")
    zero = [b for b in boxes if b.rank == 0 and b.kind == "B"]
    assert len(zero) == 4 and all(b.x0 == b.x1 for b in zero)
    for box in zero:
        col, row = canvas.pixel(box.x0, 0 + 1 + 0.2)  # device 0's row is the top one
        assert same(tuple(float(v) for v in image[row, col + 1][:3]), to_rgb(COLOURS["B"]))  # type: ignore[arg-type]


def test_the_memory_panel_shows_each_device_against_its_limit(tmp_path: Path) -> None:
    plan = synthetic_plan(2, 4, recompute=(1,))
    canvas, image, _ = draw(plan, tmp_path / "t.png")
    timeline = plan_timeline(plan)
    for d, kind in ((0, "B"), (1, RECOMPUTE)):  # device 1 recomputes: drawn orange
        assert timeline.peak_memory_bytes[d] / plan.memory_limit_bytes > 0.25  # 1 GiB static of 4
        col, row = canvas.pixel(canvas.axis * 0.5, canvas.devices - 1 - d - 0.35, memory=True)
        alpha = 0.6  # over white
        want = tuple(alpha * c + (1 - alpha) for c in to_rgb(COLOURS[kind]))
        assert same(tuple(float(v) for v in image[row, col][:3]), want), d  # type: ignore[arg-type]


def test_the_text_timeline_writes_letters_for_a_pipe_and_digits_for_a_terminal() -> None:
    plan = synthetic_plan(2, 4, "zb-h1")
    timeline = plan_timeline(plan)
    piped = text_timeline(plan, timeline, letters=True)
    assert piped[0].startswith("timeline (letter = kind") and [r.split(" │")[0] for r in piped[1:]] == [
        "device 0",
        "device 1",
    ]
    cells = "".join(r.split("│")[1] for r in piped[1:])
    assert {"F", "B", "W"} <= set(cells) and not set("0123456789") & set(cells.replace("[/]", ""))
    shown = text_timeline(plan, timeline)
    assert "[green]0[/]" in shown[1] and "digit = micro-batch" in shown[0]


def test_svg_too(tmp_path: Path) -> None:
    plan = dataclasses.replace(synthetic_plan(2, 2), schedule="gpipe")
    draw_timeline(plan, plan_timeline(plan), tmp_path / "t.svg", plan_costs(plan))
    assert (tmp_path / "t.svg").read_text().lstrip().startswith(("<?xml", "<svg"))


@pytest.mark.slow
def test_a_plan_of_64_devices_and_1536_micro_batches_is_drawn_with_every_row(tmp_path: Path) -> None:
    """The README's GPT-3 shape through the CLI: every device's row there, the picture bounded.
    How long it takes: bench/bench_timeline.py."""
    from autopipe.cli.main import main

    plan = synthetic_plan(64, 1536, "zb-h1", recompute=tuple(range(32)))
    plan.save(tmp_path / "g3.json")
    assert main(["show", str(tmp_path / "g3.json"), "--timeline", str(tmp_path / "t.png")]) == 0
    image = imread(str(tmp_path / "t.png"))
    assert max(image.shape[:2]) <= 3000
    timeline = plan_timeline(plan)
    canvas = Canvas.fit(64, 0, plan_frame(plan, timeline).width)
    canvas = dataclasses.replace(canvas, width=image.shape[1], height=image.shape[0])
    boxes = [b for b in plan_frame(plan, timeline).boxes if b.kind == "F"]
    for d in range(64):  # each device's first forward, read back (at least 3 px wide)
        first = next(b for b in boxes if b.rank == d)
        col, row = canvas.pixel(first.x0, 63 - d + 0.2)
        assert same(tuple(float(v) for v in image[row, col + 2][:3]), to_rgb(COLOURS["F"])), d  # type: ignore[arg-type]
