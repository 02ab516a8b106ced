"""Transformer Engine's FP8 casts of a linear layer, counted on the meta device (activations.fp8.cast_ops)."""

from __future__ import annotations

import torch
from torch import nn

from autopipe.costs.counting import count_block
from autopipe.costs.measure.timing import storage_key


def _linear_counts(fp8: bool) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    with torch.device("meta"):
        layer = nn.Linear(64, 96, bias=False, dtype=torch.bfloat16)
    x = torch.empty(8, 32, 64, dtype=torch.bfloat16, device="meta")
    exclude = {storage_key(p) for p in layer.parameters()}
    count, _ = count_block(layer, [x], exclude, fp8_linears=fp8)
    eager = lambda ops: tuple(op.bytes for op in ops if op.kind == "eager")  # noqa: E731
    return eager(count.forward), eager(count.backward), eager(count.backward_input)


def test_one_fp8_linear_casts_its_input_and_its_output_gradient_by_hand() -> None:
    """Input (256 tokens x 64) cast-transposed in the forward, the output gradient (256 x 96) in
    the backward (both the full backward and the input-gradient pass, which needs it first):
    read 2 bytes, write 1 + 1 an element."""
    tokens = 8 * 32
    forward, backward, backward_input = _linear_counts(fp8=True)
    assert forward == (tokens * 64 * (2 + 1 + 1),)
    assert backward == (tokens * 96 * (2 + 1 + 1),)
    assert backward_input == backward


def test_bf16_linear_has_no_casts() -> None:
    assert _linear_counts(fp8=False) == ((), (), ())


class _TwoHeads(nn.Module):
    """Two linears reading one input, as q and k do (one fused linear in Megatron-Core)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 32, bias=False, dtype=torch.bfloat16)
        self.b = nn.Linear(64, 16, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], dim=-1)


def test_linears_sharing_an_input_cast_it_once_and_each_output_gradient() -> None:
    with torch.device("meta"):
        layer = _TwoHeads()
    x = torch.empty(4, 16, 64, dtype=torch.bfloat16, device="meta")
    count, _ = count_block(layer, [x], {storage_key(p) for p in layer.parameters()}, fp8_linears=True)
    tokens = 4 * 16
    assert tuple(op.bytes for op in count.forward if op.kind == "eager") == (tokens * 64 * 4,)
    assert sorted(op.bytes for op in count.backward if op.kind == "eager") == [tokens * 16 * 4, tokens * 32 * 4]
