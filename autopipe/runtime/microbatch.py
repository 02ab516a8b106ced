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
from dataclasses import dataclass
from typing import Any

import torch

from autopipe.errors import BatchError

__all__ = ["InputSpec", "check_inputs", "flat_inputs", "input_specs", "split_batch", "split_flat"]


@dataclass(frozen=True)
class InputSpec:
    """One flat input as the model was traced with it: a tensor's dims after the batch and dtype,
    or the type of another value (a flag, None)."""

    name: str
    shape: tuple[int, ...] | None  # dims after the batch dim; None: not a tensor
    dtype: torch.dtype | None
    kind: str  # the value's type name

    def said(self, batch: int) -> str:
        if self.shape is None:
            return f"{self.name}: a {self.kind}"
        dims = ", ".join(str(d) for d in (batch, *self.shape))
        return f"{self.name}: ({dims}{',' if not self.shape else ''}) {str(self.dtype).removeprefix('torch.')}"


def input_specs(names: Sequence[str], example: object) -> tuple[InputSpec, ...]:
    """The flat inputs of one example micro-batch, as :func:`check_inputs` holds every batch to them."""
    specs = []
    for name, value in zip(names, flat_inputs(names, example), strict=False):
        name = str(name).lstrip("*")
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            specs.append(InputSpec(name, tuple(value.shape[1:]), value.dtype, "Tensor"))
        else:
            specs.append(InputSpec(name, None, None, type(value).__name__))
    return tuple(specs)


def check_inputs(specs: Sequence[InputSpec], names: Sequence[str], inputs: object, batch: int, what: str) -> None:
    """BatchError, one line naming the expected shapes, unless ``inputs`` are a batch of ``batch``
    samples like the example (``specs``): the same number of inputs, each of the example's type,
    dtype and dims after the batch dim."""
    expected = "; ".join(s.said(batch) for s in specs)
    if not isinstance(inputs, (torch.Tensor, tuple, list, Mapping)):
        raise BatchError(
            f"{what} are a {type(inputs).__name__}; give a Tensor, a tuple of positional inputs or a dict of "
            f"keyword inputs, as the model was traced with ({expected})"
        )
    flat = flat_inputs(names, inputs)
    if len(flat) != len(specs):
        raise BatchError(f"{what} are {len(flat)} value(s); the model takes {len(specs)}: {expected}")
    for spec, value in zip(specs, flat, strict=True):
        if spec.shape is None:
            continue  # a non-tensor input (a flag): the model decides
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            got = "a 0-dim tensor" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
            raise BatchError(f"{what}: {spec.name} is {got}; the model takes {spec.said(batch)}")
        if value.dtype != spec.dtype:
            raise BatchError(
                f"{what}: {spec.name} is {str(value.dtype).removeprefix('torch.')}; the model takes {spec.said(batch)}"
            )
        if tuple(value.shape[1:]) != spec.shape:
            raise BatchError(f"{what}: {spec.name} has shape {tuple(value.shape)}; the model takes {spec.said(batch)}")


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
