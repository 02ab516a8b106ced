"""Progress and notes on stderr: one bar for every slow step, and the library's own warnings.

The library never imports rich: its slow functions (``analytic_profile``, ``profile_model``,
``plan_pipeline``, ``plan_parallel``, ``emit``) take ``progress: Callable[[str, int, int],
None] | None`` and call it as ``progress(what, done, total)`` (``total`` 0: not known yet).
The CLI passes the callback :func:`progress_bar` yields: a rich bar on stderr while stderr is
a terminal, ``None`` otherwise (redirected output and ``--json`` stay clean)::

    with progress_bar(err, quiet=args.json) as progress:
        progress and progress("loading models/llama.py", 0, 0)
        profile = analytic_profile(loaded, spec, progress=progress)

The library's warnings (the ``autopipe`` logger: say, an op whose meta kernel failed and how it
was priced instead) are printed by :func:`library_notes` as ``autopipe: ...`` lines, each once.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["ProgressCallback", "library_notes", "progress_bar"]

ProgressCallback = Callable[[str, int, int], None]  # (what, done, total); total 0: unknown


@contextmanager
def progress_bar(console: Console, quiet: bool = False) -> Iterator[ProgressCallback | None]:
    """A progress-bar callback on ``console`` while the block runs; ``None`` when ``console`` is
    not a terminal or ``quiet`` (``--json``). The bar redraws itself (a thread), so it moves while
    the main thread imports torch or builds a model; it is gone when the block ends."""
    if quiet or not console.is_terminal:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, refresh_per_second=8) as bar:
        task = bar.add_task("starting", total=None)

        def report(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total if total > 0 else None)

        yield report


class _Once(logging.Handler):
    """Prints each distinct message once, as ``autopipe: MESSAGE`` on stderr."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text not in self.seen:
            self.seen.add(text)
            print(f"autopipe: {text}", file=sys.stderr)


@contextmanager
def library_notes() -> Iterator[None]:
    """The ``autopipe`` logger's warnings as one ``autopipe:`` line each (repeats dropped)."""
    logger = logging.getLogger("autopipe")
    handler, propagate = _Once(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
