"""``autopipe plan --device``, ``calibrate``: analytic plans from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main
from autopipe.cli.plan_cmd import _split_name

from autopipe.planner.parallel import Rejected

ROOT = Path(__file__).resolve().parents[2]
GPT, LLAMA = str(ROOT / "models" / "gpt.py"), str(ROOT / "models" / "llama.py")


@pytest.fixture(autouse=True)
def _one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.delenv("AUTOPIPE_DEVICES", raising=False)


def test_cli_plans_a_model_analytically_with_data_parallel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", GPT, "--device", "h100", "--gpus", "16", "--batch-size", "64", "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "tensor x pipeline x data parallel on 16 devices: chose t=" in text and "runner-up" in text
    from autopipe.plans import Plan

    plan = Plan.load(out)
    assert plan.tensor_parallel * plan.devices * plan.data_parallel == 16 and "analytic" in plan.profile_device
    assert all(m <= plan.memory_limit_bytes for m in plan.peak_memory_bytes)


@pytest.mark.slow
def test_cli_errors_and_calibrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", GPT, "--device", "tpu9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown device 'tpu9'; known devices: cpu, a100-40gb, a100-80gb, h100, h200" in err[0]
    assert main(["plan", GPT, "--dtype", "bf16", "--device", "cpu"]) == 2
    assert "--dtype bf16 applies to analytic plans" in capsys.readouterr().err
    prof = tmp_path / "p.json"
    assert (
        main(
            [
                "profile",
                GPT,
                "--device",
                "cpu",
                "--micro-batch-sizes",
                "2,4",
                "--batch-size",
                "4",
                "--repeat",
                "2",
                "-o",
                str(prof),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["calibrate", str(prof), "--model", GPT, "-o", str(tmp_path / "cal.json")]) == 0
    assert "compute efficiency" in capsys.readouterr().out
    assert (
        main(
            [
                "plan",
                GPT,
                "--analytic",
                "--calibration",
                str(tmp_path / "cal.json"),
                "--stages",
                "2",
                "-o",
                str(tmp_path / "x.json"),
            ]
        )
        == 0
    )


@pytest.mark.slow
def test_cli_3d_pins_cluster_json_and_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    out, cluster = tmp_path / "plan.json", tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"devices_per_node": 4, "nvlink_bandwidth": "200GB/s", "network_latency_s": 2e-5}))
    gpt = [GPT, "-k", "n_layer=2", "--device", "h100", "--gpus", "16", "--batch-size", "32"]
    assert (
        main(
            [
                "plan",
                *gpt,
                "--tensor-parallel",
                "2",
                "--data-parallel",
                "2",
                "--cluster",
                str(cluster),
                "--json",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    assert (got["tensor_parallel"], got["pipeline_parallel"], got["data_parallel"]) == (2, 4, 2) and got[
        "sequence_parallel"
    ]
    assert 0 < got["model_tflops_per_gpu"] <= got["hardware_tflops_per_gpu"] < 989.5
    assert main(["show", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model_tflops_per_gpu"] == got["model_tflops_per_gpu"]
    assert main(["show", str(out)]) == 0
    assert "layout: t=2 (tensor, sequence parallel), p=4 (pipeline), d=2 (data), vpp=1" in capsys.readouterr().out
    assert main(["plan", *gpt, "--tensor-parallel", "8", "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tensor-parallel 8: 8 does not divide the 4 attention heads" in err[0], err
    cluster.write_text(json.dumps({"devices_per_node": 2}))
    assert (
        main(["plan", *gpt, "--tensor-parallel", "4", "--cluster", str(cluster), "-o", str(tmp_path / "x.json")]) == 2
    )
    assert (
        "a tensor-parallel group stays within a node; 4 does not divide 2 devices per node" in capsys.readouterr().err
    )
    for flags, message in [
        (["--tensor-parallel", "2"], "--tensor-parallel applies to the devices of --gpus G"),
        (
            ["--gpus", "16", "--tensor-parallel", "4", "--stages", "8"],
            "--tensor-parallel 4 x --stages 8 = 32 does not divide --gpus 16",
        ),
        (["--gpus", "8", "--cluster", str(tmp_path / "none.json")], "cluster file not found"),
    ]:
        assert main(["plan", GPT, "--device", "h100", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_a_split_whose_stages_exceed_the_devices_left_by_t_names_no_data_parallel_width() -> None:
    assert _split_name(Rejected(4, 0, "4 stages do not divide 2 = 16 devices / t=8", tensor_parallel=8)) == "t=8 x S=4"
    assert _split_name(Rejected(4, 2, "needs more memory", tensor_parallel=2)) == "t=2 x S=4 x D=2"
    assert _split_name(Rejected(0, 0, "8 does not divide the 4 attention heads", tensor_parallel=8)) == "t=8"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sharding", "zero3"], "--sharding applies to the data-parallel replicas of --gpus G; give --gpus as well"),
        (["--overlap", "p2p"], "--overlap applies to the data-parallel replicas of --gpus G"),
        (["--gpus", "8", "--sharding", "zero9"], "--sharding zero9: use one of none, zero1, zero2, zero3, zero3-step"),
        (["--gpus", "8", "--zero1", "--sharding", "zero2"], "--zero1 and --sharding zero2 contradict each other"),
        (["--gpus", "8", "--shard-group", "2"], "--shard-group splits a sharding over fewer replicas; give --sharding"),
        (["--gpus", "8", "--sharding", "zero1", "--shard-group", "0"], "--shard-group must be"),
        (["--gpus", "8", "--overlap", "grad_reduce,fast"], "--overlap 'grad_reduce,fast': 'fast' is not an overlap"),
        (
            ["--gpus", "8", "--stages", "2", "--data-parallel", "4", "--sharding", "zero1", "--target", "torchtitan"],
            "--sharding zero1: torchtitan runs none or zero3-step with a pipeline",
        ),
    ],
)
def test_sharding_and_overlap_flags_are_checked_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    out = tmp_path / "x.json"
    code = main(["plan", GPT, "-k", "n_layer=2", "--device", "h100", "--batch-size", "16", *flags, "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_a_pinned_sharding_and_overlap_are_in_the_plan_and_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    argv = ["plan", GPT, "-k", "n_layer=4", "--device", "h100", "--gpus", "8", "--stages", "2", "--batch-size", "16"]
    argv += [
        "--sharding",
        "zero3-step",
        "--shard-group",
        "2",
        "--overlap",
        "grad_reduce,param_gather,p2p",
        "-o",
        str(out),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    from autopipe.plans import Overlap, Plan

    plan = Plan.load(out)
    assert (plan.data_parallel, plan.sharding, plan.shard_group) == (4, "zero3-step", 2)
    assert plan.overlap == Overlap(grad_reduce=True, param_gather=True, p2p=True)
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "data parallel: zero3-step over 2 of 4 replicas (hybrid); collectives" in text
    assert "overlapped: grad reduce, param gather, p2p" in text
