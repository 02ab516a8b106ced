"""The live tensor bytes counter: an exact count of a known sequence of tensors, autograd's and
the optimizer's included, views once, the caller's batch left out, resizes followed."""

from __future__ import annotations

import torch

from autopipe.graph.live_bytes import TensorBytes


def test_tensor_bytes_counts_a_known_sequence_exactly() -> None:
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
