"""``autopipe.plan_cluster``: the command line's analytic 3D plan, from Python."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

import autopipe
from autopipe.errors import PlanError
from autopipe.plans import Plan

ROOT = Path(__file__).resolve().parents[2]
GPT = str(ROOT / "models" / "gpt.py")


@pytest.fixture(autouse=True)
def _one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.delenv("AUTOPIPE_DEVICES", raising=False)


@pytest.mark.slow
def test_the_api_plan_is_the_command_lines_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"devices_per_node": 4, "nvlink_bandwidth": "200GB/s"}))
    out = tmp_path / "plan.json"
    argv = [
        "plan",
        GPT,
        "-k",
        "n_layer=4",
        "--device",
        "h100",
        "--gpus",
        "16",
        "--batch-size",
        "32",
        "--memory",
        "80GB",
        "--tensor-parallel",
        "2",
        "--cluster",
        str(cluster),
        "-o",
        str(out),
    ]
    assert main(argv) == 0, capsys.readouterr()
    by_api = autopipe.plan_cluster(
        GPT,
        kwargs={"n_layer": 4},
        device="h100",
        gpus=16,
        batch_size=32,
        memory="80GB",
        tensor_parallel=2,
        cluster=cluster,
    )
    assert by_api.to_dict() == Plan.load(out).to_dict()
    assert by_api.tensor_parallel == 2 and by_api.tensor_parallel * by_api.devices * by_api.data_parallel == 16
    # The cluster's fields as a mapping plan the same.
    same = autopipe.plan_cluster(
        GPT,
        kwargs={"n_layer": 4},
        device="h100",
        gpus=16,
        batch_size=32,
        memory="80GB",
        tensor_parallel=2,
        cluster={"devices_per_node": 4, "nvlink_bandwidth": 200e9},
    )
    assert same.to_dict() == by_api.to_dict()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"tensor_parallel": 4, "stages": 8}, "tensor_parallel 4 x stages 8 = 32 does not divide gpus 16"),
        ({"tensor_parallel": 32}, "tensor_parallel 32 does not divide gpus 16; pin degrees"),
        (
            {"tensor_parallel": 2, "stages": 2, "data_parallel": 2},
            "tensor_parallel 2 x stages 2 x data_parallel 2 = 8 does not equal gpus 16",
        ),
        ({"data_parallel": 0}, "data_parallel must be a whole number >= 1, not 0"),
        ({"cluster": {"nodes": 3}}, "cluster has no field 'nodes'; use devices_per_node"),
        ({"cluster": "/nonexistent/cluster.json"}, "cluster file not found: /nonexistent/cluster.json"),
    ],
)
def test_bad_requests_are_one_line_before_any_counting(given: dict[str, object], message: str) -> None:
    with pytest.raises(autopipe.AutopipeError) as caught:
        autopipe.plan_cluster(GPT, device="h100", gpus=16, batch_size=32, **given)  # type: ignore[arg-type]
    text = str(caught.value)
    assert message in text and "\n" not in text


def test_an_unknown_device_is_one_line() -> None:
    with pytest.raises(autopipe.AutopipeError, match="unknown device 'tpu9'"):
        autopipe.plan_cluster(GPT, device="tpu9", gpus=8, batch_size=8)


def test_plan_cluster_is_a_plan_error_type() -> None:
    with pytest.raises(PlanError):
        autopipe.plan_cluster(GPT, device="h100", gpus=16, batch_size=32, stages=3)


LLAMA_405B = {  # Llama 3.1 405B's shape (Dubey et al. 2024, Table 3): 126 layers, width 16,384, 8,192 tokens
    "preset": "llama2-70b",
    "n_layer": 126,
    "n_embd": 16384,
    "n_head": 128,
    "n_kv_head": 8,
    "intermediate_size": 53248,
    "vocab_size": 128256,
    "block_size": 8192,
}


@pytest.mark.slow  # counts a 405B model on the meta device (about 8 s)
def test_a_405b_model_at_t8_p16_fits_with_zero1_found_without_a_flag() -> None:
    """The published layout pinned (t = 8, p = 16, here d = 8) on 80 GB H100s: without sharding every
    stage recomputes (whole stages, or the modules the memory choice names: the layout does not fit
    otherwise); the free search shards the optimizer state by itself and recomputes no whole stage (it may
    still recompute the cheap modules, norms and the MLP activation, where that buys a better schedule)."""
    from autopipe import api

    spec = api.catalogue_device("h100")
    counts = api.count(str(ROOT / "models" / "llama.py"), LLAMA_405B, spec)
    profile = api.price(counts, spec)
    pinned = {"gpus": 1024, "batch_size": 1024, "tensor_parallel": 8, "stages": 16, "device": spec, "counts": counts}
    whole = api.search_cluster(profile, sharding="none", **pinned).plan  # type: ignore[arg-type]
    assert whole.sharding == "none"
    assert all(s.recompute for s in whole.stages) or whole.recompute_modules or whole.recompute_layers
    free = api.search_cluster(profile, **pinned).plan  # type: ignore[arg-type]
    assert free.sharding != "none" and free.shard_optimizer and not any(s.recompute for s in free.stages)
    assert free.step_time_s < whole.step_time_s
    assert all(m <= 80e9 for m in (*whole.peak_memory_bytes, *free.peak_memory_bytes))
