"""Which model to build: :class:`ModelSpec` (a model file, its factory, the factory's kwargs).

``models/gpt.py:build_gpt -k n_layer=4`` on the command line becomes
``ModelSpec(Path("models/gpt.py"), "build_gpt", {"n_layer": 4})``; :func:`parse_kwargs`
reads the ``-k key=value`` words and :meth:`ModelSpec.kwarg_items` writes them back, so a
plan or a profile can name its model exactly. :mod:`autopipe.model.load` builds it.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from autopipe.errors import ModelLoadError
from autopipe.units import check_path

__all__ = ["DEFAULT_FACTORY", "ModelSpec", "parse_kwargs"]

DEFAULT_FACTORY = "build_model"


def parse_kwargs(items: Sequence[str]) -> dict[str, object]:
    """``["n_layer=48", "act=gelu"]`` -> ``{"n_layer": 48, "act": "gelu"}``.

    Values are Python literals (``ast.literal_eval``: numbers, bools, None, strings, tuples,
    lists); anything else is kept as the raw string.
    """
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise ModelLoadError(f"factory argument {item!r} has no '='; write it as -k key=value (e.g. -k n_layer=4)")
        if not key.isidentifier():
            raise ModelLoadError(
                f"factory argument name {key!r} (in {item!r}) is not a Python identifier; write -k key=value"
            )
        if key in out:
            raise ModelLoadError(f"factory argument {key} is given twice (-k {key}=...); give it once")
        try:
            out[key] = ast.literal_eval(raw.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            out[key] = raw
    return out


def _format_value(value: object) -> str:
    """A kwarg value as the user would type it after ``-k key=`` (inverse of parse_kwargs)."""
    if isinstance(value, str):
        try:
            ast.literal_eval(value.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return value  # reads back as this same string
        return repr(value)
    return repr(value)


def _same(a: object, b: object) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # an object whose == does not give a bool (a tensor, say)
        return False


@dataclass(frozen=True)
class ModelSpec:
    """Which model to build: a model file, its factory function and the factory's kwargs."""

    path: Path  # as the user wrote it (relative paths stay relative, for messages)
    factory: str = DEFAULT_FACTORY
    kwargs: Mapping[str, object] = field(default_factory=dict)  # read-only view, user's order

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))

    @staticmethod
    def parse(text: str, kwargs: Mapping[str, object] | None = None) -> ModelSpec:
        """``"models/gpt.py:build_gpt"`` -> ModelSpec; the factory defaults to build_model."""
        check_path(text, "model", "a model file, path/to/model.py[:factory]", error=ModelLoadError)
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ModelLoadError(
                f"kwargs must be a mapping of the factory's keyword arguments, like {{'depth': 3}} "
                f"(got {kwargs!r:.60}, a {type(kwargs).__name__})"
            )
        text = os.fspath(text)
        path, factory = text, DEFAULT_FACTORY
        head, sep, tail = text.rpartition(":")
        if sep and not tail.endswith(".py") and ("/" not in tail and "\\" not in tail):
            path, factory = head, tail.strip()
            if not factory.isidentifier():
                raise ModelLoadError(
                    f"factory name {factory!r} in {text!r} is not a Python identifier; write MODEL.py "
                    "or MODEL.py:function_name"
                )
        if not path:
            raise ModelLoadError(f"no model file in {text!r}; write path/to/model.py[:factory]")
        return ModelSpec(Path(path), factory, dict(kwargs or {}))

    def kwarg_items(self) -> tuple[str, ...]:
        """The kwargs as ``key=value`` strings that :func:`parse_kwargs` reads back."""
        return tuple(f"{k}={_format_value(v)}" for k, v in self.kwargs.items())

    def unwritable_kwargs(self) -> tuple[str, ...]:
        """The kwargs whose values do not survive :meth:`kwarg_items` and :func:`parse_kwargs`
        (objects rather than Python literals), so a plan could not record them."""
        back = parse_kwargs(self.kwarg_items())
        return tuple(k for k, v in self.kwargs.items() if not _same(back[k], v))

    def __str__(self) -> str:
        args = "".join(f" -k {item}" for item in self.kwarg_items())
        return f"{self.path}:{self.factory}{args}"
