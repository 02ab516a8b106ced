"""How the CLI shows a Profile: a per-block table, a JSON summary (the bar: ``progress.py``).

All numbers are read at the largest profiled micro-batch size ``u`` from the affine fits in
:class:`~autopipe.api.Profile` (``y(u) = intercept + slope * u``). A block's "out" bytes are the bytes
of every tensor it produces that another block (or the loss) reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from autopipe.units import format_count

from .progress import ProgressCallback
from .progress import progress_bar as progress_reporter

if TYPE_CHECKING:
    from autopipe.api import Profile

__all__ = [
    "ProgressCallback",
    "block_out_bytes",
    "print_profile",
    "profile_summary",
    "profile_table",
    "progress_reporter",
    "wrote_line",
]

_MIB = 2.0**20


def _largest(profile: Profile) -> int:
    return max(profile.micro_batch_sizes) if profile.micro_batch_sizes else 1


def block_out_bytes(profile: Profile, index: int, u: float) -> float:
    """Bytes of the tensors block ``index`` produces, at micro-batch size ``u``."""
    return sum(t.bytes(u) for t in profile.tensors if t.src == index)


def profile_table(profile: Profile) -> Table:
    """One row per block: index, name, params, fwd ms, bwd ms, saved MiB, out MiB (largest u)."""
    u = _largest(profile)
    table = Table(
        title=f"{profile.model}: {profile.num_blocks} blocks, {profile.method} on {profile.device}, micro-batch size {u}",
        show_footer=True,
        title_justify="left",
    )
    blocks = profile.blocks
    fwd = [b.forward_s(u) * 1e3 for b in blocks]
    bwd = [b.backward_s(u) * 1e3 for b in blocks]
    saved = [b.saved_bytes(u) / _MIB for b in blocks]
    out = [block_out_bytes(profile, i, u) / _MIB for i in range(len(blocks))]
    table.add_column("#", "", justify="right")
    table.add_column("block", "total")
    table.add_column("params", format_count(sum(b.params for b in blocks)), justify="right")
    table.add_column("fwd ms", f"{sum(fwd):.3f}", justify="right")
    table.add_column("bwd ms", f"{sum(bwd):.3f}", justify="right")
    table.add_column("saved MiB", f"{sum(saved):.2f}", justify="right")
    table.add_column("out MiB", "", justify="right")
    for i, b in enumerate(blocks):
        table.add_row(
            str(i), b.name, format_count(b.params), f"{fwd[i]:.3f}", f"{bwd[i]:.3f}", f"{saved[i]:.2f}", f"{out[i]:.2f}"
        )
    return table


def wrote_line(profile: Profile, output: str) -> str:
    """``"wrote profile.json (12 blocks, measured on cuda: NVIDIA H200)"``."""
    return f"wrote {output} ({profile.num_blocks} blocks, {profile.method} on {profile.device})"


def print_profile(profile: Profile, console: Console, output: str) -> None:
    console.print(profile_table(profile))
    console.print(wrote_line(profile, output), highlight=False, soft_wrap=True)


def profile_summary(profile: Profile, output: str | None = None) -> dict[str, Any]:
    """The ``--json`` view: per block name, params and costs at the largest micro-batch size."""
    u = _largest(profile)
    return {
        "model": profile.model,
        "device": profile.device,
        "method": profile.method,
        "output": output,
        "micro_batch_size": u,
        "num_blocks": profile.num_blocks,
        "blocks": [
            {
                "index": i,
                "name": b.name,
                "params": b.params,
                "forward_s": b.forward_s(u),
                "backward_s": b.backward_s(u),
                "saved_bytes": b.saved_bytes(u),
                "out_bytes": block_out_bytes(profile, i, u),
            }
            for i, b in enumerate(profile.blocks)
        ],
    }
