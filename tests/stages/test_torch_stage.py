"""autopipe.stages.torch_stage: the input and weight halves of a stage's backward, as torch's
zero-bubble schedules call them, against one full backward (one process; the 2-rank runs:
tests/stages/test_zero_bubble_export.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from autopipe.stages.torch_stage import SplitBackwardStage


class _Stage(nn.Module):
    """A middle stage: a permuted output (its input gradient is not contiguous) and an output
    no input reaches (a weight whose path starts at an output, as a relayed position table's)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.table = nn.Parameter(torch.randn(3, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(x.permute(0, 2, 1)).tanh()  # x: (B, 4, T) read as (B, T, 4)
        return h + self.table.sum(0), self.table * 2.0


def _run(split: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    stage = _Stage()
    x = torch.randn(2, 4, 3).requires_grad_()
    outputs = stage(x)
    grads = [torch.randn_like(o) for o in outputs]
    if split:
        me: Any = SimpleNamespace(submod=stage)
        kwargs = {"stage_output": outputs, "output_grads": grads, "input_values": [x]}
        (dx,), weights = SplitBackwardStage.backward_maybe_with_nosync(me, "input", kwargs)
        assert all(p.grad is None for p in stage.parameters())  # the input half leaves the weights alone
        SplitBackwardStage.backward_maybe_with_nosync(me, "weight", {"param_groups": weights})
        assert dx is not None and dx.is_contiguous()  # torch sends it as it is
        return dx, {n: p.grad.clone() for n, p in stage.named_parameters() if p.grad is not None}
    names, params = zip(*stage.named_parameters(), strict=True)
    dx, *dw = torch.autograd.grad(outputs, [x, *params], grads)
    return dx, dict(zip(names, dw, strict=True))


def test_the_two_halves_are_one_full_backward() -> None:
    dx, want = _run(split=False)
    got_dx, got = _run(split=True)
    assert not dx.is_contiguous()  # autograd's input gradient is the permute's view (gloo refuses to send it)
    assert torch.allclose(got_dx, dx, atol=1e-6)
    assert set(got) == set(want) == {"lin.weight", "lin.bias", "table"}
    for name, g in want.items():
        assert torch.allclose(got[name], g, atol=1e-6), name


def test_a_last_stage_loss_needs_no_output_gradient() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3).requires_grad_()
    loss = lin(x).square().mean()
    me: Any = SimpleNamespace(submod=lin)
    kwargs = {"stage_output": loss, "output_grads": None, "input_values": [x]}
    (dx,), weights = SplitBackwardStage.backward_maybe_with_nosync(me, "input", kwargs)
    SplitBackwardStage.backward_maybe_with_nosync(me, "weight", {"param_groups": weights})
    want = torch.autograd.grad(lin(x).square().mean(), [x, lin.weight, lin.bias])
    assert torch.allclose(dx, want[0]) and torch.allclose(lin.weight.grad, want[1])  # type: ignore[arg-type]
    assert torch.allclose(lin.bias.grad, want[2])  # type: ignore[arg-type]
