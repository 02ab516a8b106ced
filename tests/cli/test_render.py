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

from tests.helpers import hand_profile

torch.set_num_threads(1)

GOOD = "tests/fixtures/good_mlp.py"


def test_render_numbers() -> None:
    profile = hand_profile()
    assert block_out_bytes(profile, 0, 4) == 2 * 2**20
    assert block_out_bytes(profile, -1, 4) == 256
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(profile_table(profile))
    text = console.export_text()
    row0 = next(line for line in text.splitlines() if "layers.0" in line)
    # u = 4: fwd 4 * 0.5 ms, bwd 4 * 1 ms, saved 4 MiB, out 2 MiB
    assert row0.split("│")[1:-1] == [
        " 0 ",
        " layers.0 ",
        "    272 ",
        "  2.000 ",
        "  4.000 ",
        "      4.00 ",
        "    2.00 ",
    ]
    assert "total" in text and "3.000" in text  # footer: fwd 2.0 + 1.0 ms
    assert wrote_line(profile, "p.json") == "wrote p.json (2 blocks, measured on cpu (1 threads))"
    assert profile_summary(profile)["num_blocks"] == 2
