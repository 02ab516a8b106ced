"""The analytic cost model: meta-device counting against published figures, the roofline, dtypes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autopipe.costs.analytic import (
    count_model,
    profile_from_counts,
    state_factor,
)
from autopipe.costs.counting import OpCount, op_time
from autopipe.costs.devices import DeviceSpec, device_spec
from autopipe.model.load import load_model

ROOT = Path(__file__).resolve().parents[2]
GPT, LLAMA = str(ROOT / "models" / "gpt.py"), str(ROOT / "models" / "llama.py")


@pytest.fixture(autouse=True)
def _one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.delenv("AUTOPIPE_DEVICES", raising=False)


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # unique parameters: tied ones once


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "preset", "published"),
    [
        (GPT, "gpt3-175b", 175.0e9),  # Brown et al. 2020, Table 2.1
        (LLAMA, "llama2-7b", 6_738_415_616),  # Touvron et al. 2023 (meta-llama/Llama-2-7b-hf)
        (LLAMA, "llama2-70b", 68_976_648_192),  # meta-llama/Llama-2-70b-hf
    ],
)
def test_presets_reproduce_published_parameter_counts_on_meta(path: str, preset: str, published: float) -> None:
    loaded = load_model(path, {"preset": preset}, device="meta")
    assert all(p.is_meta for p in loaded.model.parameters())
    assert _params(loaded.model) == pytest.approx(published, rel=0.01)


# GPT: 8 layers, h = 1024, s = 512, V = 50257 (Narayanan et al. 2021, eqs. 2-3 of Appendix).
L, H, S, V, B = 8, 1024, 512, 50257, 2


@pytest.fixture(scope="module")
def gpt_counts() -> object:
    torch.set_num_threads(1)
    kwargs = {"preset": "gpt2", "n_layer": L, "n_embd": H, "n_head": 16, "block_size": S}
    return count_model(load_model(GPT, kwargs, device="meta"), micro_batch_sizes=(B,))


def test_training_flops_match_narayanan_et_al(gpt_counts: object) -> None:
    counts = gpt_counts.counts[0]  # type: ignore[attr-defined]
    blocks = gpt_counts.traces[0].blocks  # type: ignore[attr-defined]
    forward = sum(c.forward_flops for c in counts)
    backward = sum(c.backward_flops for c in counts)
    layers = sum(c.forward_flops for c, b in zip(counts, blocks, strict=True) if b.name.startswith("blocks."))
    plain = 72 * B * S * L * H**2 * (1 + S / (6 * H) + V / (12 * L * H))
    recompute = 96 * B * S * L * H**2 * (1 + S / (6 * H) + V / (16 * L * H))
    assert forward + backward == pytest.approx(plain, rel=0.03)
    assert forward + backward + layers == pytest.approx(recompute, rel=0.03)  # one more forward of the layers
    # The matmul-dominated blocks: backward is about twice the forward (flash attention's
    # recomputed scores add a little).
    layer = counts[[b.name for b in blocks].index("blocks.0")]
    assert 2.0 <= layer.backward_flops / layer.forward_flops <= 2.1


def test_bf16_profile_counts_bf16_bytes_and_the_mixed_precision_state() -> None:
    loaded = load_model(GPT, {}, device="meta")
    fp32 = profile_from_counts(count_model(loaded, dtype="fp32"), device_spec("h100"))
    bf16 = profile_from_counts(count_model(load_model(GPT, {}, device="meta"), dtype="bf16"), device_spec("h100"))
    assert [b.param_bytes for b in bf16.blocks] == [b.param_bytes // 2 for b in fp32.blocks]
    assert bf16.blocks[2].saved_bytes(2) < fp32.blocks[2].saved_bytes(2)
    assert state_factor(fp32) == 4.0 and state_factor(bf16) == 8.0  # 16 bytes per parameter either way
    assert bf16.blocks[2].forward_s(2) < fp32.blocks[2].forward_s(2)  # bf16 peak is higher


SPEC = DeviceSpec("x", "x", (("fp32", 100.0),), 1.0, 10.0, 1.0, 1.0, 8, 0.0, 0.5, 0.5, 1.0)


@pytest.mark.parametrize(
    ("flops", "nbytes", "expected"),
    [(100.0, 0.0, 2.0 + 1.0), (0.0, 10.0, 2.0 + 1.0), (100.0, 100.0, 20.0 + 1.0), (1000.0, 10.0, 20.0 + 1.0)],
)
def test_op_time_is_a_roofline_with_efficiencies_and_overhead(flops: float, nbytes: float, expected: float) -> None:
    assert op_time(OpCount(flops, nbytes), SPEC, SPEC.peak("fp32")) == pytest.approx(expected)
