"""The shape pass: shape, dtype and whether it needs a gradient, for every value of the graph.

Every tensor that crosses between stages has a fixed shape at the plan's micro-batch size, so
each rank allocates its receive buffers from this table and no shapes are exchanged per step
(the same idea as torch.distributed.pipelining's static shape inference). The pass runs the
flat graph once on fake tensors (``FakeTensorMode``: no memory, no compute); parameters keep
``requires_grad``, so the pass also says which crossing values carry a gradient back. A graph
that cannot run on fake tensors (data-dependent leaf modules) is run once for real, with its
buffers restored afterwards.

Tests: tests/runtime/test_engine.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

__all__ = ["TensorSpec", "value_specs"]


@dataclass(frozen=True)
class TensorSpec:
    """What a receiver must know to allocate a buffer for a value."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool  # a gradient flows back to the value's producer


class _Record(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.specs: dict[str, TensorSpec] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            self.specs[n.name] = TensorSpec(tuple(int(s) for s in result.shape), result.dtype, result.requires_grad)
        return result


def value_specs(gm: torch.fx.GraphModule, flat_inputs: Sequence[Any]) -> dict[str, TensorSpec]:
    """``{node name: TensorSpec}`` for every tensor value of ``gm`` run on ``flat_inputs``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with mode, torch.enable_grad():
            fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in flat_inputs]
            rec = _Record(gm)
            rec.run(*fake)
        return rec.specs
    except Exception:  # any failure on fake tensors falls back to a real run
        # Fake tensors fail in many ways (data-dependent ops, ops without a fake kernel, user
        # code that inspects values); each raises its own type. A real run below gives the
        # same specs, so no failure here is an error: the real run's own errors propagate.
        pass
    saved = {k: v.detach().clone() for k, v in gm.named_buffers()}
    try:
        with torch.enable_grad():
            rec = _Record(gm)
            rec.run(*flat_inputs)
        return rec.specs
    finally:
        with torch.no_grad():
            for k, v in gm.named_buffers():
                v.copy_(saved[k])
