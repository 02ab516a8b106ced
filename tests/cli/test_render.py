"""Rendering numbers for the terminal (the progress bar: test_progress.py)."""

from __future__ import annotations

import io

import torch
from autopipe.cli.render import (
    block_out_bytes,
    profile_summary,
    profile_table,
    wrote_line,
)
from rich.console import Console

from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe

torch.set_num_threads(1)

GOOD = "tests/fixtures/good_mlp.py"


def hand_profile() -> Profile:
    """Two blocks measured at u = 1, 4; costs chosen so the numbers are easy to check."""

    def block(name: str, params: int, fwd_ms: float) -> BlockCost:
        per_u = Affine(0.0, fwd_ms * 1e-3)  # fwd_ms per sample
        return BlockCost(
            name=name, nodes=(name,), params=params, param_bytes=4 * params, forward_s=per_u,
            backward_s=Affine(0.0, 2 * fwd_ms * 1e-3), backward_input_s=per_u, backward_weight_s=per_u,
            saved_bytes=Affine(0.0, 2.0**20),  # 1 MiB per sample
        )  # fmt: skip

    return Profile(
        model=f"{GOOD}:build_model",
        recipe=TraceRecipe(tracer="fx", fingerprint="abc"),
        device="cpu (1 threads)",
        torch_version=torch.__version__,
        dtype="float32",
        micro_batch_sizes=(1, 4),
        method="measured",
        blocks=(block("layers.0", 272, 0.5), block("head", 1_500_000, 0.25)),
        tensors=(
            TensorCost("x", -1, (0,), Affine(0.0, 64.0)),
            TensorCost("layers_0", 0, (1,), Affine(0.0, 2.0**19)),  # 0.5 MiB per sample
            TensorCost("head", 1, (), Affine(0.0, 16.0)),
        ),
    )


def test_render_numbers() -> None:
    profile = hand_profile()
    assert block_out_bytes(profile, 0, 4) == 2 * 2**20
    assert block_out_bytes(profile, -1, 4) == 256
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(profile_table(profile))
    text = console.export_text()
    row0 = next(line for line in text.splitlines() if "layers.0" in line)
    # u = 4: fwd 4 * 0.5 ms, bwd 4 * 1 ms, saved 4 MiB, out 2 MiB
    assert row0.split("│")[1:-1] == [" 0 ", " layers.0 ", "    272 ", "  2.000 ", "  4.000 ", "      4.00 ", "    2.00 "]
    assert "total" in text and "3.000" in text  # footer: fwd 2.0 + 1.0 ms
    assert wrote_line(profile, "p.json") == "wrote p.json (2 blocks, measured on cpu (1 threads))"
    assert profile_summary(profile)["num_blocks"] == 2

