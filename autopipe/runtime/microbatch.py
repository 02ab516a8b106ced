"""Cut one batch into ``m`` equal micro-batches, as the flat inputs of the traced graph.

The traced graph takes its inputs flat, one placeholder per tensor: a model file's Tensor is
one input, a tuple gives its leaves in order, a dict gives its values by parameter name. Every
tensor whose first dimension is the batch is cut into ``m`` slices of ``u = B / m`` samples
along it (GPipe, Huang et al. 2019); other values (a shared mask, a flag) go to every
micro-batch whole. Targets are cut the same way.

With a mean-reduced loss and equal micro-batches, the mean over micro-batches of their mean
losses is the mean loss of the whole batch, so each micro-batch's loss is scaled by ``1/m``
and gradients accumulate to the unsplit model's gradient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["flat_inputs", "split_batch", "split_flat"]


def flat_inputs(placeholder_targets: Sequence[str], inputs: object) -> list[Any]:
    """The model file's inputs in the traced graph's placeholder order."""
    if isinstance(inputs, Mapping):
        return [inputs.get(str(t).lstrip("*")) for t in placeholder_targets]
    if isinstance(inputs, (tuple, list)):
        return list(torch.utils._pytree.tree_leaves(list(inputs)))
    return [inputs]


def _chunk(value: Any, batch_size: int, m: int, i: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch_size:
        u = batch_size // m
        return value[i * u : (i + 1) * u]
    return value


def split_flat(flat: Sequence[Any], batch_size: int, m: int) -> list[list[Any]]:
    """``m`` micro-batches of the flat inputs ``flat`` (a batch of ``batch_size``)."""
    return [[_chunk(v, batch_size, m, i) for v in flat] for i in range(m)]


def split_batch(obj: object, batch_size: int, m: int) -> list[object]:
    """``m`` micro-batches of any nest of tensors (targets), cut along the batch dimension."""
    return [torch.utils._pytree.tree_map(lambda v, i=i: _chunk(v, batch_size, m, i), obj) for i in range(m)]
