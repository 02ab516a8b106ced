"""The modes a user picks by name: recomputation, the tracer, the run's engine.

Each is a ``str`` Enum, so it equals its text (``Recompute.NEVER == "never"``), prints as it
(``f"{Recompute.NEVER}"`` is ``never``) and is written to JSON as it: plan and profile files
and the command line's text are the same as with plain strings.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from autopipe.errors import InputError

__all__ = ["Engine", "Recompute", "Tracer", "mode"]

_M = TypeVar("_M", bound="_Mode")


class _Mode(str, Enum):
    """A named mode: its text everywhere (str, format, JSON)."""

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


def mode(kind: type[_M], value: object, name: str) -> _M:
    """``value`` (a member or its text) as a member of ``kind``; InputError naming ``name``
    and the choices otherwise (``mode(Recompute, "never", "recompute")``)."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise InputError(f"{name} must be one of {choices} (got {value!r})") from None
