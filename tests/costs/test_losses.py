"""Megatron-LM's unfused cross entropy as counted (autopipe/costs/losses.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from autopipe.costs.counting import count_loss
from autopipe.costs.fusion import fuse
from autopipe.costs.losses import megatron_cross_entropy


def test_it_is_the_cross_entropy_with_its_gradient() -> None:
    """Seeded, float64: the loss and the logits' gradient are torch's cross entropy's."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5), generator=g)
    ours = megatron_cross_entropy(logits, targets)
    (grad,) = torch.autograd.grad(ours, logits)
    theirs = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    (expected,) = torch.autograd.grad(theirs, logits)
    assert torch.allclose(ours.double(), theirs) and torch.allclose(grad, expected)
    assert grad.dtype == logits.dtype  # the cast's backward hands the logits' dtype back


def test_counted_unfused_it_moves_megatrons_passes_over_the_logits() -> None:
    """bf16 logits of 64 tokens x 4,096: forward the fp32 cast (2 + 4 bytes a logit), max (4), the
    max subtracted (8), exp (8), sum (4), the division (8): 38 bytes a logit; the fp32 softmax
    saved (4). Backward: the scaling by the loss's gradient (8) and the cast back (4 + 2), with the
    made-leaf logits' gradient handed on (10): 24. Eager, no kernel merges another; fused, one
    kernel each way."""
    tokens, vocab = 64, 4096
    n = tokens * vocab
    logits = torch.empty(1, tokens, vocab, dtype=torch.bfloat16, device="meta")
    targets = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    count = count_loss(lambda outs: megatron_cross_entropy(outs[0], targets), [logits], eager=True)
    per_logit = [round(op.bytes / n) for op in count.forward if op.bytes >= n]
    assert per_logit == [6, 4, 8, 8, 4, 8]
    assert round(sum(op.bytes for op in count.backward) / n) == 24
    assert round(count.saved_bytes / n) == 4
    assert all(op.kind == "eager" for op in (*count.forward, *count.backward) if op.flops == 0)
    assert fuse(count.forward, count.escapes, count.grads) == count.forward  # kept apart
    merged = count_loss(lambda outs: megatron_cross_entropy(outs[0], targets), [logits])
    assert len(fuse(merged.forward, merged.escapes, merged.grads)) == 1
