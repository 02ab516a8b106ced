"""Timing and saved bytes of blocks run alone, against the whole model."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch
from torch import nn

from autopipe.costs.measure.measured import (
    measure_blocks,
    saved_bytes,
    storage_key,
)
from autopipe.graph.recipe import TraceRecipe
from autopipe.graph.trace import trace_model
from tests.helpers import Net


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


class _SleepBackward(torch.autograd.Function):
    """Identity whose backward sleeps ``seconds`` first."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return g, None


class _Sleepy(nn.Module):
    """A layer (kept whole by the tracer: a leaf) that sleeps ``seconds`` in its forward and
    again in its backward, on the input-gradient path (B, not W)."""

    def __init__(self, d: int, seconds: float) -> None:
        super().__init__()
        self.lin, self.seconds = nn.Linear(d, d), seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return self.lin(_SleepBackward.apply(x, self.seconds))


SLEEPS = (0.004, 0.012, 0.002)  # seconds, per sleepy layer


def test_every_block_is_timed_once_on_its_own_work() -> None:
    """One measurement per block, in order, every time positive and finite, and each sleepy
    layer's forward, backward and input-gradient time at least its own sleep. Only lower
    bounds: other work on the machine can only add time, so this cannot fail under load.
    (How close the blocks' sum comes to the whole model's forward is a figure, not a test:
    bench/bench_profile.py.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), *(_Sleepy(8, s) for s in SLEEPS), nn.Linear(8, 1))
    x = torch.randn(4, 8)
    recipe = TraceRecipe(tracer="fx", leaf_modules=("_Sleepy",))
    traced = trace_model(model, x, micro_batch_size=4, recipe=recipe)
    assert [b.name for b in traced.blocks] == [str(i) for i in range(len(SLEEPS) + 2)]
    measured = measure_blocks(traced, x, warmup=0, repeat=2)
    assert len(measured) == len(traced.blocks)
    for m in measured:
        times = (m.forward_s, m.backward_s, m.backward_input_s, m.backward_weight_s)
        assert all(math.isfinite(t) and t > 0 for t in times), m
    for m, s in zip(measured[1:-1], SLEEPS, strict=True):
        assert min(m.forward_s, m.backward_s, m.backward_input_s) >= s, (m, s)


def test_sum_of_block_saved_bytes_matches_the_whole_model() -> None:
    model = Net()
    x = torch.randint(0, 512, (4, 64))
    traced = trace_model(model, x, micro_batch_size=4, recipe=TraceRecipe(tracer="fx"))
    per_block = sum(m.saved_bytes for m in measure_blocks(traced, x, warmup=0, repeat=1))
    params = {storage_key(p) for p in model.parameters()}
    whole = saved_bytes(lambda: model(x), exclude=params)
    # A tensor saved by ops on both sides of a block boundary (the residual stream read by
    # the next layer's norm and by this layer's add) is the only allowed difference.
    assert per_block == pytest.approx(whole, rel=0.05)


def test_saved_bytes_counts_shared_storage_once_and_skips_parameters() -> None:
    lin = nn.Linear(16, 16)
    x = torch.randn(8, 16, requires_grad=True)
    params = {storage_key(p) for p in lin.parameters()}
    # x is saved by both matmuls (once), the weight is a parameter (skipped).
    assert saved_bytes(lambda: lin(x) + lin(x), exclude=params) == 8 * 16 * 4


class _SlowGrad(torch.autograd.Function):
    """Identity (a copy) whose backward takes at least 20 ms."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        return g


def test_the_training_loss_is_measured_in_the_last_block() -> None:
    """The executor computes the loss on the last stage, after the last block: the profile
    counts its forward, backward and saved bytes there, and nowhere else."""
    torch.manual_seed(0)
    model = Net(d=32, n=2, vocab=64)
    x = torch.randint(0, 64, (2, 16))
    traced = trace_model(model, x, micro_batch_size=2, recipe=TraceRecipe(tracer="fx"))

    def loss(flat: list[Any]) -> torch.Tensor:
        time.sleep(0.02)
        return (_SlowGrad.apply(flat[0]) ** 2).mean()  # pow saves the copy: one output's bytes

    plain = measure_blocks(traced, x, warmup=1, repeat=3)
    with_loss = measure_blocks(traced, x, warmup=1, repeat=3, loss=loss)
    out = model(x)
    assert with_loss[-1].saved_bytes - plain[-1].saved_bytes == out.numel() * out.element_size()
    assert [m.saved_bytes for m in with_loss[:-1]] == [m.saved_bytes for m in plain[:-1]]
    last = with_loss[-1]
    assert min(last.forward_s, last.backward_s, last.backward_input_s) >= 0.02
    assert max(m.forward_s for m in with_loss[:-1]) < 0.02


def test_kept_bytes_of_blocks_add_up_to_what_a_stages_b_keeps_for_w() -> None:
    """The bytes B keeps for W, block by block, sum to what the executor's B keeps for the
    blocks run as one stage (``graph.split_backward``): the gradients W restarts from,
    the seeds among them (in a stage the next block's B makes them, or they are received)."""
    from autopipe.costs.measure.timing import _BlockRun
    from autopipe.graph.live_bytes import TensorBytes
    from autopipe.graph.split_backward import backward_input

    class Block(nn.Module):  # a traced block's module: a tuple of outputs
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
            return (self.inner(x),)

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 32), nn.GELU()), nn.LayerNorm(32), nn.Linear(32, 24)]
    x = torch.randn(5, 8)
    per_block, h = 0, x
    for block in blocks:
        last_in = h
        run = _BlockRun.start(Block(block), [h.detach().requires_grad_(True)], exclude=set())
        per_block += run.kept_bytes()
        h = run.outs[0]
    # the head alone: W restarts from its output's gradient, the seed itself
    assert _BlockRun.start(Block(blocks[-1]), [last_in.detach().requires_grad_(True)], set()).kept_bytes() == 5 * 24 * 4

    leaf = x.clone().requires_grad_(True)
    out = nn.Sequential(*blocks)(leaf)
    params = [p for b in blocks for p in b.parameters()]
    counter = TensorBytes()
    with counter:
        seed = torch.ones_like(out)  # received by the stage's B, held by W
        grads, weight = backward_input([out], [seed], [leaf], params)
        del grads, seed
    assert counter.live == per_block > 0
    del weight
