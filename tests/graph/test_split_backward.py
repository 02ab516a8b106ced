"""The split backward (zero-bubble B and W) equals the full backward, and W computes no input
gradient."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from autopipe.graph.split_backward import backward_input

torch.set_num_threads(1)


class Counted(torch.autograd.Function):
    """Identity whose backward counts its calls (it sits on the input-gradient path)."""

    calls = 0

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        Counted.calls += 1
        return g


def chain(m: nn.ModuleDict, x: torch.Tensor) -> list[torch.Tensor]:
    h = torch.tanh(m["a"](Counted.apply(x)))  # type: ignore[no-untyped-call]
    return [m["b"](h).sum(-1).mean()]


def tied_twice(m: nn.ModuleDict, x: torch.Tensor) -> list[torch.Tensor]:
    h = torch.tanh(m["a"](x))  # the same weight twice: one boundary node below the other
    return [m["a"](h).pow(2).mean()]


def two_outputs(m: nn.ModuleDict, x: torch.Tensor) -> list[torch.Tensor]:
    h = m["a"](x)
    return [h, m["b"](torch.relu(h))]  # an output that is also read inside the stage


def branch_without_input(m: nn.ModuleDict, x: torch.Tensor) -> list[torch.Tensor]:
    side = m["b"](m.c)  # a root no input reaches: its path starts at the root
    return [m["a"](x).mean() + 0 * x.sum(), side]


CASES: list[tuple[str, Callable[[nn.ModuleDict, torch.Tensor], list[torch.Tensor]], bool]] = [
    ("chain", chain, True),
    ("tied twice", tied_twice, True),
    ("two outputs", two_outputs, True),
    ("branch without input", branch_without_input, True),
    ("first stage (input needs no gradient)", chain, False),
]


def _model() -> nn.ModuleDict:
    torch.manual_seed(0)
    m = nn.ModuleDict({"a": nn.Linear(6, 6), "b": nn.Linear(6, 6)})
    m.register_parameter("c", nn.Parameter(torch.randn(3, 6)))
    return m


@pytest.mark.parametrize(("name", "stage", "input_grad"), CASES, ids=[c[0] for c in CASES])
def test_split_backward_equals_full_backward(
    name: str,
    stage: Callable[[nn.ModuleDict, torch.Tensor], list[torch.Tensor]],
    input_grad: bool,
) -> None:
    x0 = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    full, split = _model(), _model()
    results = []
    for m in (full, split):
        x = x0.clone().requires_grad_(input_grad)
        roots = stage(m, x)
        grads = [None if r.dim() == 0 else torch.ones_like(r) * 0.5 for r in roots]
        results.append((m, x, roots, grads))
    m, x, roots, grads = results[0]
    torch.autograd.backward(roots, grads)
    m2, x2, roots2, grads2 = results[1]
    dxs, weight = backward_input(roots2, grads2, [x2] if input_grad else [], list(m2.parameters()))
    assert all(p.grad is None for p in m2.parameters())  # B leaves the weights alone
    if input_grad:
        dx, ref = dxs[0], x.grad
        assert dx is not None and ref is not None
        assert torch.allclose(dx, ref, atol=1e-6, rtol=0)
    weight.run()
    for (n, p), p2 in zip(m.named_parameters(), m2.parameters(), strict=True):
        if p.grad is None:
            assert p2.grad is None, n
        else:
            assert p2.grad is not None and torch.allclose(p2.grad, p.grad, atol=1e-6, rtol=0), n


def test_w_runs_no_input_gradient_kernel() -> None:
    m = _model()
    x = torch.randn(4, 6).requires_grad_(True)
    roots = chain(m, x)
    Counted.calls = 0
    (dx,), weight = backward_input(roots, [None], [x], list(m.parameters()))
    assert Counted.calls == 1 and dx is not None
    assert all(p.grad is None for p in m.parameters())
    weight.run()
    assert Counted.calls == 1  # W did not walk the input-gradient path again
    assert all(p.grad is not None for p in (m["a"].weight, m["b"].weight))


def test_b_lets_go_of_received_gradients_w_does_not_restart_from() -> None:
    """A stage's received gradient flows into its last op (here a GELU, in the input path): W
    restarts from the gradient kept at the linear layer below it, so the received one is not
    held from B to W (it was: a stage's B kept every root's gradient for W)."""
    import weakref

    torch.manual_seed(0)
    lin = nn.Linear(8, 16)
    x = torch.randn(4, 8, requires_grad=True)
    out = torch.nn.functional.gelu(lin(x))
    received = torch.randn_like(out)
    seed = received.clone()  # for the reference: a storage of its own
    gone = weakref.ref(received)
    grads, weight = backward_input([out], [received], [x], list(lin.parameters()))
    del received
    assert gone() is None and weight.grads == [None]
    weight.run()
    want_x, want_w, want_b = torch.autograd.grad(torch.nn.functional.gelu(lin(x)), [x, lin.weight, lin.bias], seed)
    assert grads[0] is not None and torch.allclose(grads[0], want_x)
    assert lin.weight.grad is not None and torch.allclose(lin.weight.grad, want_w)
    assert lin.bias.grad is not None and torch.allclose(lin.bias.grad, want_b)
