"""Action timers split waiting for a message from computing; CPU peak memory is measured."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from autopipe.runtime.engine import ActionRecord
from autopipe.runtime.meters import ActionTimer

torch.set_num_threads(1)


def test_action_times_split_waiting_from_work() -> None:
    timer = ActionTimer(torch.device("cpu"))
    timer.reset()
    with timer.time("1F0"):
        time.sleep(0.02)  # the message is on its way
        timer.ready()
        time.sleep(0.01)  # the stage computes
    with timer.time("0F1"):  # needed no message
        time.sleep(0.01)
    (_, s0, r0, e0), (_, s1, r1, e1) = timer.results()
    assert r0 - s0 >= 0.02 and e0 - r0 >= 0.01  # sleeps last at least that long
    assert r1 == s1 and e1 - r1 >= 0.01
    rec = ActionRecord("1F0", s0, r0, e0)
    assert rec.wait_s + rec.compute_s == pytest.approx(e0 - s0)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_cpu_peak_memory_is_measured_from_the_start_not_counted() -> None:
    from autopipe.runtime.meters import PeakMemory

    MiB = 2**20
    big = torch.ones(256 * MiB // 4)  # a peak before the steps: not theirs
    del big
    meter = PeakMemory(torch.device("cpu"))
    meter.start()
    during = torch.ones(64 * MiB // 4)  # touched: resident
    peak, kind = meter.stop(param_bytes=10 * MiB)
    del during
    assert 74 * MiB <= peak < 200 * MiB
    assert kind.startswith("cpu: peak resident memory during the steps (VmHWM, reset before the first step)")


def test_tensor_bytes_counts_a_known_sequence_exactly() -> None:
    from autopipe.runtime.meters import TensorBytes

    held = torch.zeros(1000)  # 4000 bytes, counted from the start
    batch = torch.ones(64)  # the caller's data: neither it nor its views count
    counter = TensorBytes([held], ignore=[batch])
    assert (counter.live, counter.peak) == (4000, 4000)
    with counter:
        a = torch.ones(250)  # + 1000 -> 5000
        view = a.view(25, 10)  # a view: the same storage, counted once
        x = torch.empty(500)  # + 2000 -> 7000
        del x  # -> 5000
        y = a * 2  # + 1000 -> 6000
        del a, view  # -> 5000
        z = torch.empty(2000, dtype=torch.float64)  # + 16000 -> 21000, the peak
        del z  # -> 5000
        half = batch[:32] * 1  # + 128 -> 5128; batch[:32] is the batch's
        y.resize_(500)  # grows by 1000 -> 6128
    assert (counter.live, counter.peak) == (6128, 21000)
    del y, half  # freed after the counter stopped counting new tensors: still followed
    assert counter.live == 4000


def test_tensor_bytes_sees_autograd_and_the_optimizer() -> None:
    from autopipe.runtime.meters import TensorBytes

    w = torch.nn.Parameter(torch.randn(100, 100))  # 40000 bytes
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    counter = TensorBytes([w])
    with counter:
        x = torch.randn(10, 100)  # 4000
        (x @ w).relu().sum().backward()  # the gradient stays: 40000
        opt.step()  # the momentum buffer: 40000
        del x
    assert counter.live == 3 * 40000
    assert counter.peak >= 3 * 40000 + 4000  # x was alive while the graph was
