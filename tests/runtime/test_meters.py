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
        with timer.sending():  # hands its output to another rank
            time.sleep(0.005)
    (_, s0, r0, e0, p0), (_, s1, r1, e1, p1) = timer.results()
    assert r0 - s0 >= 0.02 and e0 - r0 >= 0.01  # sleeps last at least that long
    assert r1 == s1 and e1 - r1 >= 0.015
    assert p0 == 0.0 and 0.005 <= p1 <= e1 - r1 - 0.01  # the sending is part of the work
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
