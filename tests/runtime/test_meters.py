"""Action timers split waiting for a message from computing."""

from __future__ import annotations

import time

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
