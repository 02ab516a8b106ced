"""FLOP and byte counting per block against torch's FlopCounterMode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from autopipe.costs.analytic import count_model
from autopipe.costs.counting import count_block
from autopipe.costs.measured import storage_key
from autopipe.graph.segment import extract
from autopipe.model.load import load_model

ROOT = Path(__file__).resolve().parents[2]
GPT, LLAMA = str(ROOT / "models" / "gpt.py"), str(ROOT / "models" / "llama.py")


@pytest.fixture(autouse=True)
def _one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.delenv("AUTOPIPE_DEVICES", raising=False)


def test_counting_agrees_with_flop_counter_mode() -> None:
    loaded = load_model(GPT, {}, device="meta")
    counts = count_model(loaded, micro_batch_sizes=(2,))
    traced = counts.traces[0]
    block = next(b for b in traced.blocks if b.name == "blocks.1")
    seg = extract(traced.gm, block.nodes)
    args = [torch.empty(2, 64, 128, device="meta")]
    count, _ = count_block(seg.module, args, {storage_key(p) for p in traced.gm.parameters()})
    leaf = args[0].requires_grad_(True)
    with FlopCounterMode(display=False) as fc:
        from autopipe.costs.counting import fused_attention

        with fused_attention():
            out = seg.module(leaf)[0]
        out.backward(torch.ones_like(out))
    assert count.forward_flops + count.backward_flops == fc.get_total_flops()
    assert count == counts.counts[0][block.index]  # identical layers are counted once, same result
