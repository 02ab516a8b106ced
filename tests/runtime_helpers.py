"""Helpers for the runtime tests: the single-process reference (plans: tests/_plans.py)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from autopipe.model.load import call_model, load_model


def reference_training(
    model_file: str, kwargs: Mapping[str, object], *, steps: int, batch_size: int, lr: float,
    optimizer: str = "SGD", seed: int = 0,
) -> tuple[list[float], dict[str, torch.Tensor]]:  # fmt: skip
    """Losses and final state_dict of plain single-process training of the unsplit model."""
    torch.manual_seed(seed)
    lm = load_model(model_file, dict(kwargs))
    model = lm.model
    model.train()
    opt = getattr(torch.optim, optimizer)(list(model.parameters()), lr=lr)
    losses = []
    for k in range(steps):
        torch.manual_seed(seed + k + 1)
        x = lm.make_inputs(batch_size)
        y = lm.make_targets(batch_size) if lm.make_targets is not None else None
        loss = lm.loss_fn(call_model(model, x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Largest absolute difference over the keys of ``b`` (all must be in ``a``)."""
    missing = sorted(set(b) - set(a))
    if missing:
        raise AssertionError(f"missing from the pipeline's state: {missing[:5]}")
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in b if b[k].numel())
