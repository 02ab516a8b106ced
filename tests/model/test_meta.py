"""Building on meta without running the weight initialisers: same model, no fills run."""

from __future__ import annotations

import time

import torch

from autopipe.model.load import load_model
from autopipe.model.meta import SkipMetaFills
from tests.helpers import MODELS

torch.set_num_threads(1)


def test_fills_of_meta_tensors_are_skipped_and_others_run() -> None:
    meta = torch.empty(3, 4, device="meta")
    cpu = torch.zeros(3, 4)
    with SkipMetaFills():
        assert torch.nn.init.normal_(meta, std=0.02) is meta
        torch.nn.init.ones_(cpu)  # fill_ on a real tensor still writes
        cpu.normal_(mean=5.0, std=0.1)
        moved = meta.add_(1.0)  # not a fill: runs (on meta, shape only)
    assert meta.shape == (3, 4) and meta.is_meta and moved.shape == (3, 4)
    assert 4.0 < float(cpu.mean()) < 6.0


def test_meta_build_matches_a_real_build_and_is_quick() -> None:
    kwargs = {"preset": "tiny", "n_layer": 3}
    real = load_model(str(MODELS / "gpt.py"), kwargs)
    meta = load_model(str(MODELS / "gpt.py"), kwargs, device="meta")
    shapes = {n: (p.shape, p.dtype) for n, p in real.model.named_parameters()}
    assert {n: (p.shape, p.dtype) for n, p in meta.model.named_parameters()} == shapes
    assert all(p.is_meta for p in meta.model.parameters())
    start = time.process_time()
    load_model(str(MODELS / "gpt.py"), {"preset": "gpt3-175b", "n_layer": 8}, device="meta")
    assert time.process_time() - start < 0.4  # 0.07 s here; ~1 s with the fills run (8 layers 12,288 wide)
