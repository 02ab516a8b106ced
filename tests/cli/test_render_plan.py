"""The plan table says which device runs each chunk: a pinned ZB-V plan (a V) and an
interleaved one (round robin), read back from the printed table, the placement line and --json."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main
from autopipe.cli.render_plan import print_plan
from rich.console import Console

from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.plans import Plan


def chain(n: int) -> Profile:
    """``n`` equal blocks of 1 ms forward, 2 ms backward, 1 MiB saved per sample."""
    blocks = tuple(
        BlockCost(
            name=f"layers.{i}",
            nodes=(f"n{i}",),
            params=1000,
            param_bytes=4000,
            forward_s=Affine(1e-5, 1e-3),
            backward_s=Affine(2e-5, 2e-3),
            backward_input_s=Affine(1e-5, 1e-3),
            backward_weight_s=Affine(1e-5, 1e-3),
            saved_bytes=Affine(0.0, 2.0**20),
        )
        for i in range(n)
    )
    tensors = tuple(TensorCost(f"n{i}", i, (i + 1,), Affine(0.0, 2.0**20)) for i in range(n - 1))
    return Profile(
        model="chain",
        recipe=TraceRecipe(tracer="fx", fingerprint="fp"),
        device="cpu (1 threads)",
        torch_version=torch.__version__,
        dtype="float32",
        micro_batch_sizes=(1, 2),
        method="measured",
        blocks=blocks,
        tensors=tensors,
    )


def planned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stages: int, *pin: str
) -> tuple[Plan, dict[str, object]]:
    profile, path = tmp_path / "profile.json", tmp_path / "plan.json"
    chain(8).save(profile)
    args = ["plan", "--profile", str(profile), "--stages", str(stages), "--memory", "1GiB", "--batch-size", "8", *pin]
    assert main([*args, "-o", str(path), "--json"]) == 0
    return Plan.load(path), json.loads(capsys.readouterr().out)


def printed(plan: Plan) -> list[str]:
    console = Console(width=250, file=io.StringIO(), record=True)
    print_plan(plan, console)
    return console.export_text().splitlines()


def device_column(lines: list[str]) -> list[str]:
    """The stage table's device cells, in stage order (the first table printed)."""
    table = lines[: next(i for i, line in enumerate(lines) if line.startswith("└"))]
    return [line.split("│")[2].strip() for line in table if line.startswith("│")]


def test_a_zb_v_plan_shows_its_v(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan, as_json = planned(tmp_path, capsys, 4, "--schedule", "zb-v")
    lines = printed(plan)
    # chunk j and 7-j on device j: down the V (↓) on chunks 0-3, back up (↑) on 4-7
    assert device_column(lines) == ["0 ↓", "1 ↓", "2 ↓", "3 ↓", "3 ↑", "2 ↑", "1 ↑", "0 ↑"]
    placed = next(line for line in lines if "placement" in line)
    assert placed == (
        "V placement: device 0 runs chunks 0 and 7, device 1 runs 1 and 6, device 2 runs 2 and 5, "
        "device 3 runs 3 and 4 "
        "(down the V on chunks 0-3, back up on 4-7: the first and the last chunk on device 0)"
    )
    stages = as_json["stages"]
    assert isinstance(stages, list) and [s["device"] for s in stages] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [s["index"] for s in stages] == list(range(8)) and as_json["virtual"] == 2


def test_an_interleaved_plan_shows_its_round_robin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan, as_json = planned(tmp_path, capsys, 2, "--schedule", "interleaved-1f1b", "--virtual", "2")
    lines = printed(plan)
    assert device_column(lines) == ["0", "1", "0", "1"]
    assert (
        "round-robin placement: device 0 runs chunks 0 and 2, device 1 runs 1 and 3 (chunk j on device j mod 2)"
        in lines
    )
    stages = as_json["stages"]
    assert isinstance(stages, list) and [s["device"] for s in stages] == [0, 1, 0, 1]


def test_one_chunk_per_device_needs_no_placement_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan, _ = planned(tmp_path, capsys, 2, "--schedule", "1f1b")
    lines = printed(plan)
    assert device_column(lines) == ["0", "1"] and not any("placement" in line for line in lines)


def test_plan_strings_are_printed_as_text_never_as_markup_or_terminal_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``[/]`` in a name (rich markup that would raise) and escape sequences (a retitled, recoloured
    terminal) from a plan file: printed, escaped, by show."""
    from tests.helpers import even_plan

    raw = json.loads(even_plan("mlp.py").to_json())
    raw["model"] = "x[/]\x1b]0;pwned\x07[bold]y.py:build_model"
    raw["stages"][0]["blocks"][0] = "lay[/]ers\x1b[31m.0"
    (tmp_path / "plan.json").write_text(json.dumps(raw))
    assert main(["show", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "x[/]\\x1b]0;pwned\\x07[bold]y.py:build_model" in out and "lay[/]ers\\x1b[31m.0" in out


def test_a_timeline_too_big_to_draw_is_not_simulated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """8 devices x 20,000 micro-batches (within the plan reader's caps): show prints the plan and one
    line instead of simulating 480,000 actions; --timeline is refused before any work."""
    from tests.helpers import even_plan

    raw = json.loads(even_plan("mlp.py", stages=2).to_json())
    stages = [{**raw["stages"][0], "index": i, "rank": i, "blocks": [f"b{i}"], "block_indices": [i]} for i in range(8)]
    raw.update(stages=stages, devices=8, micro_batches=20_000, batch_size=20_000, peak_memory_bytes=[0.0] * 8)
    raw["micro_batch_size"] = 1
    (tmp_path / "plan.json").write_text(json.dumps(raw))
    reason = (
        "the plan has up to 480,000 actions (8 chunks x 20000 micro-batches x F, B, W), "
        "more than autopipe draws (400,000)"
    )
    assert main(["show", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert " ".join(out.split()).endswith(f"no timeline: {reason}")
    assert main(["show", str(tmp_path / "plan.json"), "--timeline", str(tmp_path / "t.png")]) == 2
    assert capsys.readouterr().err == (
        f"autopipe: error: --timeline {tmp_path / 't.png'}: {reason}; show the plan without --timeline\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_memory_choice_is_shown_and_in_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from autopipe.cli.render_plan import layout_line, plan_json

    plan, _ = planned(tmp_path, capsys, 2)
    choices = {
        "recompute_modules": "activations: recompute core_attn+mlp in every layer (selective recomputation)",
        "recompute_layers": "activations: recompute the first 2 layers of each stage whole",
        "offload_modules": "activations: offload qkv_linear in every layer (its saved inputs to the host and back)",
    }
    values: dict[str, object] = {
        "recompute_modules": ("core_attn", "mlp"),
        "recompute_layers": 2,
        "offload_modules": ("qkv_linear",),
    }
    for field, line in choices.items():
        chosen = dataclasses.replace(plan, **{field: values[field]})  # type: ignore[arg-type]
        assert line in printed(chosen)
        assert plan_json(chosen)[field] == (list(values[field]) if field != "recompute_layers" else 2)  # type: ignore[call-overload]
    assert "recompute selective (core_attn mlp)" in layout_line(
        dataclasses.replace(plan, recompute_modules=("core_attn", "mlp"))
    )
    assert not any(line.startswith("activations:") for line in printed(plan))
