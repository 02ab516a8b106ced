"""FLOP and byte counting per block against torch's FlopCounterMode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from autopipe.costs.analytic import count_model
from autopipe.costs.counting import count_block, op_time
from autopipe.costs.measure.measured import storage_key
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
        from autopipe.costs.sdpa import fused_attention

        with fused_attention():
            out = seg.module(leaf)[0]
        out.backward(torch.ones_like(out))
    assert count.forward_flops + count.backward_flops == fc.get_total_flops()
    assert count == counts.counts[0][block.index]  # identical layers are counted once, same result


def test_causal_fused_attention_runs_half_its_counted_flops() -> None:
    from torch.nn import functional as F

    from autopipe.costs.devices import device_spec

    class Attend(torch.nn.Module):
        def __init__(self, causal: bool) -> None:
            super().__init__()
            self.causal = causal

        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    qkv = [torch.empty(1, 2, 1024, 32, device="meta") for _ in range(3)]  # compute-bound on an H100
    causal, _ = count_block(Attend(True), qkv)
    full, _ = count_block(Attend(False), qkv)
    ops = [op for op in (*causal.forward, *causal.backward) if op.kind == "attention"]
    assert len(ops) == 2 and all(op.work == 0.5 for op in ops)
    assert all(op.work == 1.0 for op in (*full.forward, *full.backward))
    assert causal.forward_flops == full.forward_flops  # the count keeps the convention: every score
    h100 = device_spec("h100")
    peak = h100.peak("fp32")
    f_causal = next(op for op in causal.forward if op.kind == "attention")
    f_full = next(op for op in full.forward if op.kind == "attention")
    compute = f_full.flops / (peak * h100.efficiency("fp32"))
    assert op_time(f_full, h100, peak, "fp32") == pytest.approx(compute + h100.op_overhead_s)
    assert op_time(f_causal, h100, peak, "fp32") == pytest.approx(compute / 2 + h100.op_overhead_s)
