"""Calibration: the analytic profile agrees with a measured one after fitting the efficiencies."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from autopipe.costs import devices
from autopipe.costs.analytic import analytic_profile
from autopipe.costs.calibrate import (
    _GRID,
    _OVERHEADS,
    calibrate,
    save_calibration,
    stored_calibration,
)
from autopipe.costs.devices import device_spec
from autopipe.costs.measure import timing
from autopipe.costs.measure.measured import profile_model
from autopipe.costs.profile import Profile
from autopipe.model.load import load_model

ROOT = Path(__file__).resolve().parents[2]
GPT, LLAMA = str(ROOT / "models" / "gpt.py"), str(ROOT / "models" / "llama.py")


@pytest.fixture(autouse=True)
def _one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.delenv("AUTOPIPE_DEVICES", raising=False)


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
    """The fit recovers known efficiencies: a measured profile of models/gpt.py (its blocks,
    tensors and bytes as measured) whose block times are what the analytic model predicts for
    efficiencies on the fit's grid. (How close a real CPU's times come: bench/bench_calibrate.py.)"""
    sizes = (4, 8)
    measured = profile_model(load_model(GPT, {}), micro_batch_sizes=sizes, warmup=0, repeat=1)
    base = device_spec("cpu")
    known = base.calibrated(float(_GRID[25]), float(_GRID[11]), float(_OVERHEADS[30]))  # 0.26, 0.07, 10 us
    truth = analytic_profile(load_model(GPT, {}, device="meta"), known, micro_batch_sizes=sizes)
    fields = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
    synthetic = dataclasses.replace(
        measured,
        blocks=tuple(
            dataclasses.replace(m, **{f: getattr(t, f) for f in fields})
            for m, t in zip(measured.blocks, truth.blocks, strict=True)
        ),
    )
    synthetic.save(tmp_path / "profile.json")
    cal = calibrate(Profile.load(tmp_path / "profile.json"), model=GPT)
    assert cal.max_error < 1e-9 and cal.observations == 2 * 2 * len([b for b in truth.blocks if b.forward_s(4) > 0])
    assert (cal.spec.compute_efficiency, cal.spec.op_overhead_s) == (known.compute_efficiency, known.op_overhead_s)
    save_calibration(cal)
    assert stored_calibration(device_spec("cpu")) == cal.spec  # the analytic profile will use it
    analytic = analytic_profile(
        load_model(GPT, {}, device="meta"), stored_calibration(device_spec("cpu")), micro_batch_sizes=sizes
    )
    assert analytic.method == "analytic" and analytic.recipe.fingerprint == measured.recipe.fingerprint
    assert [b.nodes for b in analytic.blocks] == [b.nodes for b in measured.blocks]
    assert [t.name for t in analytic.tensors] == [t.name for t in measured.tensors]
    for a, m, t in zip(analytic.blocks, measured.blocks, truth.blocks, strict=True):
        assert (a.params, a.param_bytes) == (m.params, m.param_bytes)
        for u in sizes:
            assert a.saved_bytes(u) == pytest.approx(m.saved_bytes(u), abs=0.5)  # exact: integers
            assert a.forward_s(u) == pytest.approx(t.forward_s(u), rel=1e-9), a.name
            assert a.backward_s(u) == pytest.approx(t.backward_s(u), rel=1e-9), a.name
