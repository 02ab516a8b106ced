"""The modes a user picks by name: recomputation, the tracer, the run's engine, the sharding.

Each is a ``str`` Enum, so it equals its text (``Recompute.NEVER == "never"``), prints as it
(``f"{Recompute.NEVER}"`` is ``never``, ``{!r}`` ``'never'``) and is written to JSON as it: plan and profile files
and the command line's text are the same as with plain strings.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Engine", "Recompute", "Sharding", "Tracer"]


class _Mode(str, Enum):
    """A named mode: its text everywhere (str, format, repr, JSON), so no message changes."""

    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Recompute(_Mode):
    """Which stages recompute their activations in the backward."""

    AUTO = "auto"  # the planner chooses per stage
    NEVER = "never"
    ALWAYS = "always"


class Tracer(_Mode):
    """How a model is traced into a graph (``auto``: fx, then torch.export if fx fails)."""

    AUTO = "auto"
    FX = "fx"
    EXPORT = "export"


class Engine(_Mode):
    """What runs a plan in ``autopipe run``: autopipe's executor or torch.distributed.pipelining."""

    AUTOPIPE = "autopipe"
    TORCH = "torch"


class Sharding(_Mode):
    """How the training state is split over a stage's data-parallel replicas (Rajbhandari et al.
    2020, "ZeRO"; per parameter, with ``2 + 2 + K`` bytes of bf16 weights, bf16 gradients and K of
    fp32 optimizer state and master weights, over a group of ``N`` replicas)."""

    NONE = "none"  # every replica holds everything; gradients all-reduced (2 + 2 + K)
    ZERO1 = "zero1"  # optimizer state and master weights split (2 + 2 + K / N): Megatron's distributed optimizer
    ZERO2 = "zero2"  # and gradients, reduce-scattered each micro-batch (2 + (2 + K) / N)
    ZERO3 = "zero3"  # and weights, all-gathered per use in each micro-batch's forward and backward ((2 + 2 + K) / N)
    ZERO3_STEP = "zero3-step"  # ZeRO-3 gathered once per step and kept (FSDP without resharding): ZeRO-1's memory
