"""The training loss as a framework computes it, for counting (``count_model(..., loss_fn=...)``).

Megatron-LM without ``--cross-entropy-loss-fusion`` (an opt-in flag: off by default in
core_r0.8.0, the version of Megatron-Core's H100 table, and in every Megatron-LM before it)
computes the language model's loss with ``vocab_parallel_cross_entropy``
(``megatron/core/tensor_parallel/cross_entropy.py``), one aten kernel per step over the device's
``(tokens, vocabulary / t)`` logits::

    forward    x = logits.float()          read 2, write 4 bytes a logit (bf16 logits)
               max over the vocabulary      read 4
               x -= max                     read 4, write 4
               exp(x, out=x)                read 4, write 4
               sum over the vocabulary      read 4
               x /= sum                     read 4, write 4     x, the fp32 softmax, saved
    backward   x[target] -= 1               (one element a token: not counted)
               x *= grad_output             read 4, write 4
               cast to the logits' dtype    read 4, write 2

about 52 bytes a logit where a fused kernel reads the logits once and writes their gradient
once, and 4 bytes a logit saved for the backward. :func:`megatron_cross_entropy` runs the same
steps, so counting it (``counting.count_loss``) sees these kernels and bytes; counted with
``eager_loss`` its kernels stay apart (``costs.fusion`` does not merge them). The two indexed
steps touch one element a token, but the counting prices an indexed op as a pass over its whole
tensor, so on the meta device (counting, where there are no values) they are left out; on real
tensors they run, and the loss and its gradient are the cross entropy's. The ``all_reduce`` of
the max, the target logit and the sum over the t ranks move ``tokens`` numbers each: not
counted.

Tests: tests/costs/test_losses.py.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["megatron_cross_entropy"]


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron-LM's ``_VocabParallelCrossEntropy`` on one device's logits (no label smoothing)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = logits.float()  # calculate_logits_max
        top = torch.max(x, dim=-1)[0]
        x -= top.unsqueeze(dim=-1)  # calculate_predicted_logits
        predicted = _at_targets(x, target)
        x.exp_()  # Megatron's torch.exp(x, out=x): the same kernel (counted here without out='s extra pass)
        total = x.sum(dim=-1)
        loss = torch.log(total) - predicted  # calculate_cross_entropy_loss
        x.div_(total.unsqueeze(dim=-1))
        ctx.save_for_backward(x, target)
        ctx.logits_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        softmax, target = ctx.saved_tensors
        grad = softmax  # prepare_gradient_calculation_operands: in place, as Megatron's
        if not grad.is_meta:  # calculate_gradients: one element a token (not counted, module docstring)
            rows = torch.arange(target.numel(), device=grad.device)
            grad.view(-1, grad.shape[-1])[rows, target.reshape(-1)] -= 1.0
        grad.mul_(grad_output.unsqueeze(dim=-1))
        return grad.to(ctx.logits_dtype), None  # the cast's backward, as autograd runs it


def _at_targets(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``x``'s entry at each token's target (Megatron's ``logits_2d[arange_1d, masked_target_1d]``);
    on the meta device, where there are no values, an empty one of its shape (module docstring)."""
    if x.is_meta:
        return torch.empty(target.shape, dtype=x.dtype, device=x.device)
    return torch.gather(x, -1, target.unsqueeze(-1)).squeeze(-1)


def megatron_cross_entropy(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy of ``output`` (..., V) logits against ``targets`` (...) ids,
    computed as Megatron-LM's unfused ``vocab_parallel_cross_entropy`` computes it (module
    docstring): a model file's ``loss_fn`` for counting a run that used it."""
    losses = _VocabParallelCrossEntropy.apply(output, targets)  # type: ignore[no-untyped-call]
    assert isinstance(losses, torch.Tensor)
    return losses.mean()
