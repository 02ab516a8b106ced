"""The accelerator catalogue: names, aliases, user device files, the measured CPU."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autopipe.costs.devices import DeviceError, device_spec, known_devices, match_device


@pytest.fixture(autouse=True)
def _one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.delenv("AUTOPIPE_DEVICES", raising=False)


def test_the_h800_is_an_h100_with_less_nvlink() -> None:
    """DeepSeek-V3's GPU (Zhao et al. 2025): NVLink 400 GB/s both ways instead of 900."""
    h800, h100 = device_spec("h800"), device_spec("h100")
    assert h800.nvlink_bandwidth == 200e9 and h100.nvlink_bandwidth == 450e9  # one direction each
    assert match_device("cuda: NVIDIA H800") == "h800" and device_spec("H800-SXM").name == "h800"
    same = ("nvlink_bandwidth", "name", "description", "match", "aliases")
    assert replace(h800, **{f: getattr(h100, f) for f in same}) == h100


def test_device_catalogue_names_and_user_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"cpu", "a100-40gb", "a100-80gb", "h100", "h800", "h200"} <= set(known_devices())
    assert device_spec("H100-SXM").name == "h100" and device_spec("h200").memory_bytes == 141e9
    assert device_spec("h100").peak("bf16") > device_spec("a100-80gb").peak("bf16")
    assert match_device("cuda: NVIDIA H200") == "h200" and match_device("cpu: x86_64, 1 threads") == "cpu"
    with pytest.raises(DeviceError, match=r"unknown device 'h900'; known devices: cpu, a100-40gb"):
        device_spec("h900")
    mine = {
        "mi300x": {
            "peak_flops": {"bf16": 1.3e15},
            "memory_bytes": 192e9,
            "memory_bandwidth": 5.3e12,
            "nvlink_bandwidth": 448e9,
            "network_bandwidth": 50e9,
        }
    }
    (tmp_path / "mine.json").write_text(json.dumps(mine))
    assert device_spec("mi300x", [tmp_path / "mine.json"]).peak("fp16") == 1.3e15
    monkeypatch.setenv("AUTOPIPE_DEVICES", str(tmp_path / "mine.json"))
    assert "mi300x" in known_devices()
    (tmp_path / "bad.json").write_text(json.dumps({"broken": {"memory_bytes": 1}}))
    with pytest.raises(DeviceError, match=r"'broken' .* is incomplete"):
        device_spec("h100", [tmp_path / "bad.json"])
    cpu = device_spec("cpu")
    assert cpu.peak("fp32") > 1e8 and cpu.memory_bandwidth > 1e8
