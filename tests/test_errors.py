"""The error hierarchy (autopipe/errors.py): bad input is a ValueError, a failed run a RuntimeError."""

from __future__ import annotations

import inspect

import pytest

from autopipe import errors
from autopipe.costs.devices import DeviceError
from cli.args import UsageError

_ALL = [getattr(errors, n) for n in errors.__all__ if n != "Terminated"] + [DeviceError, UsageError]


def test_autopipe_error_is_an_exception_but_neither_a_value_nor_a_runtime_error() -> None:
    assert issubclass(errors.AutopipeError, Exception)
    assert not issubclass(errors.AutopipeError, (ValueError, RuntimeError))


@pytest.mark.parametrize("cls", _ALL, ids=lambda c: c.__name__)
def test_every_error_is_either_bad_input_or_a_failed_run(cls: type[Exception]) -> None:
    assert inspect.isclass(cls) and issubclass(cls, errors.AutopipeError)
    if cls is errors.AutopipeError:
        return
    failed_run = issubclass(cls, errors.RuntimeFailure)
    assert issubclass(cls, RuntimeError) == failed_run
    assert issubclass(cls, ValueError) == (not failed_run)


def test_a_dead_rank_is_not_a_value_error() -> None:
    with pytest.raises(RuntimeError):
        raise errors.CommunicationError("rank 1 failed: it died", rank=1)
    assert not isinstance(errors.RuntimeFailure("x"), ValueError)


def test_terminated_is_a_signal_not_an_error() -> None:
    """SIGTERM's exception passes every ``except Exception`` (and the user-code guard), like Ctrl-C's."""
    assert issubclass(errors.Terminated, BaseException) and not issubclass(errors.Terminated, Exception)
