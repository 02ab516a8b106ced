"""The exceptions autopipe raises: one family, every one exported and caught as AutopipeError."""

from __future__ import annotations

import inspect

import pytest

import autopipe.errors as errors


def _classes() -> list[type[BaseException]]:
    return [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]


def test_every_error_is_an_autopipe_error_and_exported() -> None:
    classes = _classes()
    assert errors.AutopipeError in classes and len(classes) > 5
    for cls in classes:
        assert issubclass(cls, errors.AutopipeError) or not issubclass(cls, Exception), cls
        assert cls.__name__ in errors.__all__, f"{cls.__name__} is missing from autopipe.errors.__all__"
        assert cls.__doc__, f"{cls.__name__} says in its docstring when it is raised"


@pytest.mark.parametrize("name", ["ProfileError", "PlanError", "EmitError", "RunOptionError"])
def test_an_error_caught_as_autopipe_error_keeps_its_one_line_message(name: str) -> None:
    cls = getattr(errors, name)
    with pytest.raises(errors.AutopipeError, match=r"^--x must be at least 1 \(got 0\)$"):
        raise cls("--x must be at least 1 (got 0)")
