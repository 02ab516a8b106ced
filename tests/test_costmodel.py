"""The analytic cost model: meta-device counting, device specs, calibration, the CLI."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main
from torch.utils.flop_counter import FlopCounterMode

from autopipe.costs import devices, timing
from autopipe.costs.analytic import (
    analytic_profile,
    count_model,
    op_time,
    profile_from_counts,
    state_factor,
)
from autopipe.costs.calibrate import calibrate, save_calibration, stored_calibration
from autopipe.costs.counting import OpCount, count_block
from autopipe.costs.devices import DeviceError, DeviceSpec, device_spec, known_devices, match_device
from autopipe.costs.measured import profile_model, storage_key
from autopipe.costs.profile import Affine, Profile
from autopipe.graph.segment import extract
from autopipe.model.load import load_model

ROOT = Path(__file__).resolve().parent.parent
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


def _cpu_time_once(fn: Callable[[], object]) -> float:
    """Seconds of this thread's CPU time that one call of ``fn`` takes."""
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def _cpu_best_time(fn: Callable[[], object], repeat: int) -> float:
    """devices._best_time on this thread's CPU time."""
    fn()
    return max(min(_cpu_time_once(fn) for _ in range(repeat)), 1e-9)


@pytest.fixture
def _cpu_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The profiler and the CPU's peak measured on this thread's CPU time, not wall time.

    On a shared machine wall time also counts the time other processes held the core: 2-4x
    with a busy loop beside the test, unevenly between blocks and between the profile and the
    peak the calibration divides by (a peak measured low clips the fitted efficiency at 1).
    torch runs on this one thread, so its CPU time is the time on a quiet machine.
    """
    monkeypatch.setattr(timing, "_time_once", _cpu_time_once)
    monkeypatch.setattr(devices, "_best_time", _cpu_best_time)
    devices.measure_cpu.cache_clear()
    yield
    devices.measure_cpu.cache_clear()  # later tests measure the CPU on the wall clock again


@pytest.mark.slow
@pytest.mark.usefixtures("_cpu_clock")
def test_analytic_and_measured_profiles_agree_after_calibration(tmp_path: Path) -> None:
    sizes = (4, 8)
    # Measured on the CPU clock (_cpu_clock); other processes' use of the caches still adds
    # a little, so each block keeps its fastest of 3 runs.
    runs = [profile_model(load_model(GPT, {}), micro_batch_sizes=sizes, warmup=2, repeat=5) for _ in range(3)]
    measured = _fastest(runs)
    path = tmp_path / "profile.json"
    measured.save(path)
    cal = calibrate(measured)
    save_calibration(cal)
    assert stored_calibration(device_spec("cpu")) == cal.spec  # the analytic profile will use it
    analytic = analytic_profile(load_model(GPT, {}, device="meta"), stored_calibration(device_spec("cpu")), micro_batch_sizes=sizes)
    assert analytic.method == "analytic" and analytic.recipe.fingerprint == measured.recipe.fingerprint
    assert [b.nodes for b in analytic.blocks] == [b.nodes for b in measured.blocks]
    assert [t.name for t in analytic.tensors] == [t.name for t in measured.tensors]
    for a, m in zip(analytic.blocks, measured.blocks, strict=True):
        assert (a.params, a.param_bytes) == (m.params, m.param_bytes)
        for u in sizes:
            assert a.saved_bytes(u) == pytest.approx(m.saved_bytes(u), abs=0.5)  # exact: integers
    # Time, on the blocks that take a meaningful time: the transformer layers and the LM head
    # (each over 10% of the largest; the embeddings and final norm take a few microseconds).
    biggest = max(b.forward_s(8) for b in measured.blocks)
    timed = [(a, m) for a, m in zip(analytic.blocks, measured.blocks, strict=True) if m.forward_s(8) > 0.1 * biggest]
    assert {a.name for a, _ in timed} == {"blocks.0", "blocks.1", "blocks.2", "blocks.3", "lm_head"}
    for a, m in timed:
        for u in sizes:
            assert a.forward_s(u) == pytest.approx(m.forward_s(u), rel=0.3), a.name
            assert a.backward_s(u) == pytest.approx(m.backward_s(u), rel=0.3), a.name


def _fastest(runs: list[Profile]) -> Profile:
    sizes = runs[0].micro_batch_sizes

    def fit(i: int, field: str) -> Affine:
        return Affine.fit(sizes, [min(getattr(r.blocks[i], field)(u) for r in runs) for u in sizes])

    fields = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
    blocks = tuple(
        dataclasses.replace(b, **{f: fit(i, f) for f in fields}) for i, b in enumerate(runs[0].blocks)
    )
    return dataclasses.replace(runs[0], blocks=blocks)


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


def test_device_catalogue_names_and_user_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"cpu", "a100-40gb", "a100-80gb", "h100", "h200"} <= set(known_devices())
    assert device_spec("H100-SXM").name == "h100" and device_spec("h200").memory_bytes == 141e9
    assert device_spec("h100").peak("bf16") > device_spec("a100-80gb").peak("bf16")
    assert match_device("cuda: NVIDIA H200") == "h200" and match_device("cpu: x86_64, 1 threads") == "cpu"
    with pytest.raises(DeviceError, match=r"unknown device 'h900'; known devices: cpu, a100-40gb"):
        device_spec("h900")
    mine = {"mi300x": {"peak_flops": {"bf16": 1.3e15}, "memory_bytes": 192e9, "memory_bandwidth": 5.3e12,
                       "nvlink_bandwidth": 448e9, "network_bandwidth": 50e9}}  # fmt: skip
    (tmp_path / "mine.json").write_text(json.dumps(mine))
    assert device_spec("mi300x", [tmp_path / "mine.json"]).peak("fp16") == 1.3e15
    monkeypatch.setenv("AUTOPIPE_DEVICES", str(tmp_path / "mine.json"))
    assert "mi300x" in known_devices()
    (tmp_path / "bad.json").write_text(json.dumps({"broken": {"memory_bytes": 1}}))
    with pytest.raises(DeviceError, match=r"'broken' .* is incomplete"):
        device_spec("h100", [tmp_path / "bad.json"])
    cpu = device_spec("cpu")
    assert cpu.peak("fp32") > 1e8 and cpu.memory_bandwidth > 1e8


def test_cli_plans_a_model_analytically_with_data_parallel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", GPT, "--device", "h100", "--gpus", "16", "--batch-size", "64", "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "data x pipeline parallel on 16 devices: chose S=" in text and "runner-up" in text
    from autopipe.plans import Plan

    plan = Plan.load(out)
    assert plan.devices * plan.data_parallel == 16 and "analytic" in plan.profile_device
    assert all(m <= plan.memory_limit_bytes for m in plan.peak_memory_bytes)


@pytest.mark.slow
def test_cli_errors_and_calibrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", GPT, "--device", "tpu9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown device 'tpu9'; known devices: cpu, a100-40gb, a100-80gb, h100, h200" in err[0]
    assert main(["plan", GPT, "--dtype", "bf16", "--device", "cpu"]) == 2
    assert "--dtype bf16 applies to analytic plans" in capsys.readouterr().err
    prof = tmp_path / "p.json"
    assert main(["profile", GPT, "--device", "cpu", "--micro-batch-sizes", "2,4", "--batch-size", "4", "--repeat", "2", "-o", str(prof)]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(prof), "-o", str(tmp_path / "cal.json")]) == 0
    assert "compute efficiency" in capsys.readouterr().out
    assert main(["plan", GPT, "--analytic", "--calibration", str(tmp_path / "cal.json"), "--stages", "2", "-o", str(tmp_path / "x.json")]) == 0
