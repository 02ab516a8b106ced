"""Turn exceptions raised by the user's model file into one-line messages.

autopipe runs code it did not write (the model file's factory, example inputs, loss, the
model's forward). When that code raises, the user needs three things on one line: which of
their functions failed, their own message, and the line of *their* file where it happened --
not a frame deep inside torch. These helpers find that frame and format the line; every caller
that runs user code goes through them so all such messages read alike.

:func:`guarded` is the one guard every call into user code goes through: it turns *anything* the
code raises -- an ``Exception``, ``SystemExit``, a ``BaseException`` subclass of the user's, an
exception whose ``__str__`` itself fails, a ``KeyboardInterrupt`` the code raised rather than the
user's Ctrl-C -- into one :class:`~autopipe.errors.ModelLoadError` line, and, in the main thread,
ends a call that runs past the model-file time limit (:func:`load_timeout`, ``--load-timeout``)
with a line naming the function and how to raise the limit. A real Ctrl-C (SIGINT while the code
runs) still ends the command as an interrupt (exit 130). ``os._exit`` cannot be caught in the
process that calls it: only the ranks of ``autopipe run`` (child processes) report it.

Tests: tests/model/test_usercode.py (and tests/model/test_load.py).
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from autopipe.errors import AutopipeError, InputError, ModelLoadError, Terminated

__all__ = [
    "DEFAULT_LOAD_TIMEOUT_S",
    "LOAD_TIMEOUT_ENV",
    "MAX_LOAD_TIMEOUT_S",
    "check_load_timeout",
    "current_load_timeout",
    "display_path",
    "env_load_timeout",
    "exception_summary",
    "exit_summary",
    "first_line",
    "guarded",
    "load_timeout",
    "too_small_for_batchnorm",
    "user_location",
]

DEFAULT_LOAD_TIMEOUT_S = 300.0
"""Seconds one model-file call (the import, ``build_model``, ``example_inputs``, ``train_data`` and its
first batch, the check forward) may take by default; ``--load-timeout`` / :func:`load_timeout` change it."""
MAX_LOAD_TIMEOUT_S = 7 * 24 * 3600.0  # a week; 0 means no limit
LOAD_TIMEOUT_ENV = "AUTOPIPE_LOAD_TIMEOUT"  # the launcher's limit, for its ranks (seconds; 0: none)
_LIMIT: ContextVar[float | None] = ContextVar("autopipe_load_timeout", default=DEFAULT_LOAD_TIMEOUT_S)

_MAX_MESSAGE = 300  # characters of the user's message kept in a one-line error


def display_path(filename: str | Path, shown_as: Path | None = None) -> str:
    """``filename`` as the user reads it: ``shown_as`` if it is a relative path naming the same
    file (the path they typed), else relative to the working directory when below it (a plan
    records an absolute path for a model file outside its folder), else absolute."""
    p = Path(filename)
    if shown_as is not None and not shown_as.is_absolute() and _same_file(p, shown_as):
        return str(shown_as)
    try:
        return os.path.relpath(p.resolve()) if p.resolve().is_relative_to(Path.cwd()) else str(p)
    except (OSError, ValueError):
        return str(p)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def user_location(tb: TracebackType | None, path: Path) -> str | None:
    """``"file:line"`` of the innermost frame of ``tb`` inside the user's file ``path``.

    Falls back to the innermost frame in the same folder (a helper module the model file
    imports), and to ``None`` when the traceback never passes through the user's code.
    """
    frames = traceback.extract_tb(tb)
    target = path.resolve()
    for frame in reversed(frames):
        if frame.lineno is not None and _same_file(Path(frame.filename), target):
            return f"{display_path(frame.filename, path)}:{frame.lineno}"
    folder = target.parent
    for frame in reversed(frames):
        f = Path(frame.filename)
        if frame.lineno is not None and f.is_absolute() and f.resolve().parent == folder:
            return f"{display_path(f)}:{frame.lineno}"
    return None


def _text(exc: BaseException) -> str:
    """``str(exc)``, or a note saying why there is none: a user's ``__str__`` may raise or return a non-str."""
    try:
        text = str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        return f"<its message cannot be shown: str() raised {type(e).__name__}>"
    return text


def _repr(value: object) -> str:
    try:
        return repr(value)
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        return f"<a {type(value).__name__} whose repr() raised {type(e).__name__}>"


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message, shortened to stay readable."""
    for line in _text(exc).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 1] + "…"
    return ""


_BATCHNORM = re.compile(
    r"Expected more than 1 value per channel when training, got input size (torch\.Size\()?(\[[^\]]*\])"
)


def too_small_for_batchnorm(exc: BaseException) -> str | None:
    """The line for torch's ``Expected more than 1 value per channel when training`` (a training-mode
    BatchNorm given one sample per channel: a micro-batch of 1), else None: the cause is the plan's
    micro-batch size, not the model's code or its tracing, so the line says what to change."""
    found = _BATCHNORM.search(_text(exc))
    if found is None:
        return None
    return (
        f"the micro-batch is too small for BatchNorm: in training mode it needs more than 1 value per channel, "
        f"and got input size {found.group(2)}; plan with a larger micro-batch (fewer --micro-batches or a "
        "larger --batch-size; micro_batches= / batch_size= in Python)"
    )


def exception_summary(exc: BaseException, path: Path) -> str:
    """``"ValueError: their message (models/x.py:12)"`` -- one line, location when known."""
    message = first_line(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    where = user_location(exc.__traceback__, path)
    return f"{text} ({where})" if where else text


def exit_summary(exc: SystemExit, path: Path) -> str:
    """``"called sys.exit(5) (models/x.py:12)"``: user code that tried to end the process, which
    autopipe refuses (an exit from a model file would end autopipe silently with its code)."""
    where = user_location(exc.__traceback__, path)
    text = f"called sys.exit({_repr(exc.code)})" if exc.code is not None else "called sys.exit()"
    return f"{text} ({where})" if where else text


# ----------------------------------------------------------------------------- the guard


def check_load_timeout(value: object, name: str = "load_timeout") -> float | None:
    """``value`` as seconds (None or 0: no limit); InputError naming it as ``name`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name} must be a number of seconds (0: no limit), not a {type(value).__name__}")
    if not math.isfinite(value) or not 0 <= value <= MAX_LOAD_TIMEOUT_S:
        raise InputError(f"{name} must be from 0 (no limit) to {MAX_LOAD_TIMEOUT_S:g} seconds (got {value!r})")
    return float(value) or None


@contextmanager
def load_timeout(seconds: float | None, name: str = "seconds") -> Iterator[None]:
    """Within the block, each model-file call may run ``seconds`` (None or 0: no limit); the
    default is :data:`DEFAULT_LOAD_TIMEOUT_S`. The CLI's ``--load-timeout`` sets it so (``name``:
    how a bad value is named)."""
    token = _LIMIT.set(check_load_timeout(seconds, name))
    try:
        yield
    finally:
        _LIMIT.reset(token)


def current_load_timeout() -> float | None:
    """The limit in force here (None: no limit), as ``autopipe run`` hands it to its ranks."""
    return _LIMIT.get()


def env_load_timeout(text: str | None) -> float | None:
    """The limit a rank was given in :data:`LOAD_TIMEOUT_ENV` (the default when unset or unreadable)."""
    try:
        return check_load_timeout(float(text)) if text is not None else DEFAULT_LOAD_TIMEOUT_S
    except (ValueError, InputError):
        return DEFAULT_LOAD_TIMEOUT_S


class _Expired(BaseException):
    """The model-file time limit of the innermost timed guard ran out (raised by SIGALRM)."""


class _Interrupted:
    """Whether SIGINT arrived while user code ran (the user's Ctrl-C), as opposed to the code
    raising ``KeyboardInterrupt`` itself; ``then``: the handler it stands in for, called after
    (None: Python's own, which raises ``KeyboardInterrupt``)."""

    def __init__(self, then: Callable[[int, FrameType | None], Any] | None = None) -> None:
        self.seen = False
        self.then = then

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.seen = True
        if self.then is not None:
            self.then(signum, frame)
            return
        raise KeyboardInterrupt


_Handler = Callable[[int, FrameType | None], Any] | int | None


@contextmanager
def _alarm(limit: float | None) -> Iterator[None]:
    """SIGALRM after ``limit`` seconds raises :class:`_Expired` (main thread only; an outer timer,
    a caller's included, gets its handler and its remaining time back, less the time spent)."""
    if limit is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise _Expired()

    previous: _Handler = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    outer, interval = signal.setitimer(signal.ITIMER_REAL, limit)
    if outer and outer < limit:  # an outer timer ends first: keep its deadline
        signal.setitimer(signal.ITIMER_REAL, outer)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 1e-3), interval)


@contextmanager
def _sigint_watch() -> Iterator[_Interrupted]:
    """Watch for SIGINT while the block runs (main thread: a handler that notes it, then does what
    the one it replaces did). Ignored or left to the OS (SIG_IGN, SIG_DFL: a background job, nohup),
    a Ctrl-C cannot raise ``KeyboardInterrupt`` here, so one the code raises is the code's own; off the
    main thread, or under a handler not set from Python, the two cannot be told apart: taken for
    the user's."""
    current = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if isinstance(current, _Interrupted):  # an outer guard watches already
        yield current
        return
    if current in (signal.SIG_IGN, signal.SIG_DFL):
        yield _Interrupted()
        return
    if not callable(current):
        seen = _Interrupted()
        seen.seen = True
        yield seen
        return
    seen = _Interrupted(None if current is signal.default_int_handler else current)
    signal.signal(signal.SIGINT, seen)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, current)


@contextmanager
def guarded(
    what: str,
    path: Path,
    *,
    raised: Callable[[str], str] | None = None,
    exited: Callable[[str], str] | None = None,
    timed: bool = True,
) -> Iterator[None]:
    """Run the block (a call into user code, ``what`` naming it: ``build_model``,
    ``example_inputs(8)``) so that whatever it raises becomes one ModelLoadError line.

    ``raised`` and ``exited`` word the line for an exception and for ``sys.exit`` from its summary
    (default: ``"{what} raised {summary}"``, ``"{what} in {path} {summary}; return or raise instead
    of exiting"``). An autopipe error passes unchanged; a real Ctrl-C stays
    a ``KeyboardInterrupt``. ``timed``: the block gets the model-file time limit (tracing and
    profiling, whose time grows with the model, are guarded untimed).
    """
    limit = _LIMIT.get() if timed else None
    if raised is None:
        raised = lambda summary: f"{what} raised {summary}"  # noqa: E731
    if exited is None:
        exited = lambda summary: f"{what} in {path} {summary}; return or raise instead of exiting"  # noqa: E731
    try:
        with _sigint_watch() as interrupt, _alarm(limit):
            yield
    except AutopipeError:
        raise
    except _Expired:
        if limit is None:  # an outer guard's limit, inside this untimed block: the outer one says it
            raise
        where = what if str(path) in what else f"{what} in {path}"
        raise ModelLoadError(
            f"{where} did not finish within {limit:g} s, the time limit for model-file calls; "
            "if it is only slow, raise the limit (--load-timeout SECONDS, 0 for none; "
            "autopipe.load_timeout(SECONDS) in Python)"
        ) from None
    except Terminated:  # SIGTERM to the command (cli/main.py's handler), not the user's code
        raise
    except SystemExit as e:
        raise ModelLoadError(exited(exit_summary(e, path))) from e
    except KeyboardInterrupt as e:
        if interrupt.seen:
            raise
        raise ModelLoadError(raised(exception_summary(e, path))) from e
    except BaseException as e:
        if (small := too_small_for_batchnorm(e)) is not None:
            raise ModelLoadError(small) from e
        raise ModelLoadError(raised(exception_summary(e, path))) from e
