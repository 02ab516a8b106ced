"""Size-dependent compute efficiency (devices.py compute_curve) and fp8 pricing (analytic.py)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from autopipe.costs.analytic import PRECISIONS, count_model, profile_from_counts
from autopipe.costs.calibrate import (
    _GRID,
    CURVE_POINTS,
    Calibration,
    fit_efficiency,
    save_calibration,
    stored_calibration,
)
from autopipe.costs.counting import OpCount, block_time, count_block, op_time
from autopipe.costs.devices import DeviceError, device_spec, read_device_file
from autopipe.costs.tensor import split_ops
from autopipe.model.load import load_model

ROOT = Path(__file__).resolve().parents[2]
GPT = str(ROOT / "models" / "gpt.py")
ENTRY = {
    "peak_flops": {"bf16": 1e15},
    "memory_bytes": 80e9,
    "memory_bandwidth": 3e12,
    "nvlink_bandwidth": 450e9,
    "network_bandwidth": 50e9,
}


@pytest.fixture(autouse=True)
def _one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.delenv("AUTOPIPE_DEVICES", raising=False)


def _device(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"mine": {**ENTRY, **extra}}))
    return path


def test_the_curve_rises_with_size_and_saturates_at_eff_max() -> None:
    h100 = device_spec("h100")
    sizes = [16, 64, 128, 512, 2048, 8192, 65536]
    effs = [h100.efficiency("bf16", s) for s in sizes]
    assert all(a < b for a, b in itertools.pairwise(effs))  # monotone
    assert h100.efficiency("bf16", 512) == pytest.approx(0.675 / 2)  # half of eff_max at s_half
    assert effs[-1] == pytest.approx(0.675, rel=1e-2) and max(effs) < 0.675  # saturates below eff_max
    assert h100.efficiency("bf16", 4096) == pytest.approx(0.6)  # the old flat figure at a 4096 GEMM
    assert h100.efficiency("bf16") == 0.6 and h100.plateau("bf16") == 0.675  # not a GEMM (size 0): flat
    assert h100.efficiency("fp32", 16) == h100.compute_efficiency == 0.6  # no fp32 curve: flat


def test_an_old_entry_with_one_compute_efficiency_means_a_flat_curve(tmp_path: Path) -> None:
    old = read_device_file(_device(tmp_path, compute_efficiency=0.42))["mine"]
    assert old.compute_curve == ()
    assert {old.efficiency(d, s) for d in ("bf16", "fp16") for s in (0, 8, 100_000)} == {0.42}
    op = OpCount(1e12, 0.0, "linear", (16.0, 16.0, 16.0))
    assert op_time(op, old, old.peak("bf16"), "bf16") == pytest.approx(1e12 / (1e15 * 0.42) + old.op_overhead_s)


@pytest.mark.parametrize(
    ("curve", "message"),
    [
        ({"bf16": {"eff_max": 1.5, "s_half": 128}}, r"compute_curve.bf16: eff_max must be in \(0, 1\] and s_half >= 0"),
        ({"bf16": {"eff_max": 0.6, "s_half": -1}}, r"compute_curve.bf16: eff_max must be in \(0, 1\] and s_half >= 0"),
        ({"fp4": {"eff_max": 0.6, "s_half": 1}}, r"compute_curve names dtype 'fp4'; use one of: fp32, tf32, bf16"),
        ({"bf16": 0.6}, r'compute_curve.bf16 must be \{"eff_max": E, "s_half": S\} \(got 0.6\)'),
        ({"bf16": {"eff_max": 0.6, "shalf": 1}}, r"compute_curve.bf16 must be"),
        ([0.6], r"compute_curve must be an object like"),
    ],
)
def test_bad_curves_are_one_line_errors(tmp_path: Path, curve: object, message: str) -> None:
    with pytest.raises(DeviceError, match=r"device 'mine' in .*dev.json: " + message) as e:
        read_device_file(_device(tmp_path, compute_curve=curve))
    assert "\n" not in str(e.value)


def test_counted_gemms_carry_kind_and_shape() -> None:
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 48)).to("meta")
    count, _ = count_block(mlp, [torch.empty(4, 8, 64, device="meta")])
    gemms = [op for op in count.forward if op.flops]
    assert [(op.kind, op.dims) for op in gemms] == [("linear", (32.0, 64.0, 256.0)), ("linear", (32.0, 256.0, 48.0))]
    assert all(op.kind == "" and op.dims == () for op in count.forward if not op.flops)
    assert {op.kind for op in count.backward if op.flops} == {"linear"}
    assert gemms[0].size == pytest.approx((32 * 64 * 256) ** (1 / 3))  # the side of the square GEMM of its FLOPs
    # tensor parallelism splits the largest dimension (the sharded weight dimension) for the curve
    assert split_ops(gemms, "layer", 4, False)[0].dims == (32.0, 64.0, 64.0)


def test_fp8_prices_linear_layers_at_the_fp8_peak_and_the_rest_at_bf16() -> None:
    h100 = device_spec("h100")
    assert h100.peak("fp8") == 1978.9e12 and device_spec("h200").peak("fp8") == 1978.9e12
    linear = OpCount(4e12, 1.0, "linear", (4096.0, 4096.0, 4096.0))
    attention = OpCount(4e12, 1.0)  # fused attention: FLOPs, no GEMM shape
    batched = OpCount(4e12, 1.0, "bmm", (4096.0, 4096.0, 4096.0))
    o = h100.op_overhead_s
    fp8 = 4e12 / (1978.9e12 * h100.efficiency("fp8", 4096)) + o
    bf16 = 4e12 / (989.5e12 * h100.efficiency("bf16", 4096)) + o
    assert block_time([linear], h100, "bf16", "fp8") == pytest.approx(fp8)
    assert block_time([attention], h100, "bf16", "fp8") == pytest.approx(4e12 / (989.5e12 * 0.6) + o)  # flat
    assert h100.efficiency("fp8", 4096) == pytest.approx(0.55 * 0.8)
    assert block_time([batched], h100, "bf16", "fp8") == pytest.approx(bf16)
    assert block_time([linear], h100, "bf16") == pytest.approx(bf16) and bf16 > fp8
    with pytest.raises(DeviceError, match=r"device a100-80gb gives no peak for fp8 \(fp8 needs an FP8 GPU: h100"):
        block_time([linear], device_spec("a100-80gb"), "bf16", "fp8")


@pytest.mark.slow
def test_an_fp8_profile_of_a_big_decoder_is_faster_than_bf16_with_the_same_memory() -> None:
    kwargs = {"n_layer": 4, "n_embd": 2048, "n_head": 16, "vocab_size": 8192, "block_size": 1024}
    counts = count_model(load_model(GPT, kwargs, device="meta"), micro_batch_sizes=(1, 2), dtype="fp8")
    h100 = device_spec("h100")
    fp8 = profile_from_counts(counts, h100)
    bf16 = profile_from_counts(dataclasses.replace(counts, precision=PRECISIONS["bf16"]), h100)
    assert "(analytic, fp8)" in fp8.device and fp8.dtype == "bfloat16"
    for u in (1, 2):
        f8 = sum(b.forward_s(u) + b.backward_s(u) for b in fp8.blocks)
        f16 = sum(b.forward_s(u) + b.backward_s(u) for b in bf16.blocks)
        assert 1.1 * f8 < f16 < 2 * f8  # linear layers ~2x faster, attention and the rest unchanged
    assert [b.saved_bytes for b in fp8.blocks] == [b.saved_bytes for b in bf16.blocks]
    assert [b.param_bytes for b in fp8.blocks] == [b.param_bytes for b in bf16.blocks]


def _ops(sizes: list[float]) -> list[list[OpCount]]:
    return [[OpCount(2 * s**3, 3 * 2 * s * s, "linear", (s, s, s))] for s in sizes]


@pytest.mark.parametrize("n", [4, CURVE_POINTS])
def test_calibration_refits_eff_max_and_with_enough_points_the_shape(n: int) -> None:
    base = device_spec("h100")
    ce, me = float(_GRID[36]), float(_GRID[30])  # on the fit's grid: recovered exactly
    truth = base.with_curve("bf16", ce, 256.0 if n >= CURVE_POINTS else 512.0).calibrated(ce, me, 0.0, "bf16")
    ops = _ops([float(s) for s in np.geomspace(256, 16384, n)])
    measured = [block_time(seq, truth, "bf16") for seq in ops]
    spec, errors = fit_efficiency(base, "bf16", ops, measured)
    s_half = dict((d, h) for d, _, h in spec.compute_curve)["bf16"]
    assert s_half == (256.0 if n >= CURVE_POINTS else 512.0)  # few points: the entry's shape kept
    assert spec.plateau("bf16") == pytest.approx(ce) and float(np.max(errors)) < 1e-9
    ratio = spec.plateau("bf16") / base.plateau("bf16")
    assert spec.plateau("fp8") == pytest.approx(base.plateau("fp8") * ratio)  # one device-wide factor
    assert spec.compute_efficiency == pytest.approx(base.compute_efficiency * ratio)


def test_calibration_files_keep_the_curve_and_old_ones_still_load(tmp_path: Path) -> None:
    spec = device_spec("h100").calibrated(0.5, 0.6, 1e-5, "bf16")
    path = save_calibration(Calibration(spec, "m", 3, 0.01, 0.02), tmp_path / "cal.json")
    assert stored_calibration(device_spec("h100"), path) == spec
    raw = json.loads(path.read_text())
    del raw["h100"]["compute_curve"]  # a file written before curves: flat
    path.write_text(json.dumps(raw))
    old = stored_calibration(device_spec("h100"), path)
    assert old.compute_curve == () and old.efficiency("bf16", 64) == spec.compute_efficiency


@pytest.mark.slow
def test_cli_refuses_fp8_on_a_gpu_without_it_and_unknown_dtypes(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "autopipe.cli", "plan", str(ROOT / "models" / "mlp.py"), "--device"]
    done = subprocess.run([*base, "a100", "--dtype", "fp8"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "gives no peak for fp8 (fp8 needs an FP8 GPU: h100, h800, h200)" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    bad = subprocess.run([*base, "h100", "--dtype", "fp9"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice: 'fp9'" in bad.stderr
