"""The ``autopipe`` command: build the parser, dispatch to a command, map errors to exit codes.

Each command lives in its own module (``profile_cmd``, ``plan_cmd``, ``emit_cmd``,
``run_cmd``, ``analytic_cmd``); no planning logic lives in the CLI. Exit codes, decided in one place (:func:`main`):

- 0 success;
- 1 a pipeline run failed (``autopipe run``: a rank raised, died or timed out):
  :class:`autopipe.errors.RuntimeFailure`, printed as one ``autopipe: error:`` line naming the rank;
- 2 bad input: any :class:`autopipe.errors.AutopipeError` prints ``autopipe: error: <message>``
  (one line) to stderr; argparse usage errors exit 2 as well, also as one line;
- 130 interrupted (Ctrl-C); 143 terminated (SIGTERM: cleaned up, then one line); 141 the output
  pipe closed (``| head``);
- anything else is a bug in autopipe and propagates with its traceback.

Usage::

    autopipe profile models/gpt.py -k n_layer=4 --batch-size 8 -o profile.json
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, redirect_stdout
from typing import Any, NoReturn

from rich.console import Console
from rich.text import Text

from autopipe import __version__
from autopipe._io import printable
from autopipe.errors import AutopipeError, RuntimeFailure, Terminated

from .analytic_cmd import add_calibrate_parser
from .common import load_timeout_seconds
from .config_cmd import add_config_parser
from .emit_cmd import add_emit_parsers
from .plan_cmd import add_plan_parsers
from .profile_cmd import add_profile_parser
from .progress import library_notes
from .run_cmd import add_run_parser

__all__ = ["build_parser", "main"]

EXIT_FAILED_RUN = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a tool ended by a closed pipe
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)  # stdout on a device that takes no more


class _Parser(argparse.ArgumentParser):
    """argparse that takes a word starting with ``-`` and a digit (``--memory -5GB``,
    ``--lr -1``) as the value it follows, not as an unknown option, so that the value's own
    check refuses it in one line. (Plain argparse does so only for bare numbers like ``-5``.)
    A usage error is one line too. Sub-commands are made of the same class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"autopipe: error: {message}; see '{self.prog} --help'\n")


class _Console(Console):
    """rich's Console as autopipe prints with it: strings are text, never markup (a ``[/]`` in a model's
    or a block's name is printed, not parsed; autopipe's own styled lines pass ``markup=True`` or a
    ``Text``), control characters in them are shown as escapes (:func:`autopipe._io.printable`), and
    a closed output pipe is left to :func:`main` (rich would exit 1)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(markup=False, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(printable(text), **kwargs)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="autopipe",
        description="Plan pipeline parallelism for a PyTorch model: profile it, pick stage cuts, "
        "micro-batches, schedule and recomputation.",
    )
    parser.add_argument("--version", action="version", version=f"autopipe {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_profile_parser(commands)
    add_plan_parsers(commands)
    add_emit_parsers(commands)
    add_run_parser(commands)
    add_calibrate_parser(commands)
    add_config_parser(commands)
    return parser


# ----------------------------------------------------------------------------- entry point


def _stdout_kept_for_json(args: argparse.Namespace) -> AbstractContextManager[object]:
    """With ``--json`` stdout carries one JSON object only: while the command runs, ``print`` (a
    ``print`` in the user's forward or build_model) writes to stderr; the command's own output goes
    through ``out``, made on the real stdout before. (Writes to file descriptor 1 from C code are
    not redirected.)"""
    return redirect_stdout(sys.stderr) if getattr(args, "json", False) else nullcontext()


def _user_limits(args: argparse.Namespace) -> AbstractContextManager[object]:
    """``--load-timeout``, for the commands that import a model file (the library's default without it)."""
    seconds = load_timeout_seconds(args)
    if seconds is None:
        return nullcontext()
    from autopipe.api import load_timeout

    return load_timeout(seconds, "--load-timeout")


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`~autopipe.errors.Terminated` while the command runs, so what it was
    writing is cleaned up as on any error; installed only over the default action, in the main
    thread (a caller's own handler is left alone), and put back after."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``autopipe`` command line; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors (argparse exits 2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    # Tables stay readable when piped (rich assumes 80 columns without a terminal).
    out = _Console(file=sys.stdout, highlight=False, width=None if sys.stdout.isatty() else 120)
    err = _Console(file=sys.stderr, highlight=False)
    try:
        with library_notes(), _sigterm_raises():
            with _user_limits(args), _stdout_kept_for_json(args):
                code: int = args.func(args, out, err)
            sys.stdout.flush()  # here, so a full device is one line, not an error at exit
        return code
    except RuntimeFailure as e:
        print(f"autopipe: error: {e}", file=sys.stderr)
        return EXIT_FAILED_RUN
    except AutopipeError as e:
        print(f"autopipe: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("autopipe: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print("autopipe: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except BrokenPipeError:  # the reader went away (``autopipe show plan.json | head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so exiting flushes nowhere
        return EXIT_BROKEN_PIPE
    except OSError as e:
        if e.errno not in _FULL:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        why = f"cannot write the output: {e.strerror}; free some space or write elsewhere"
        print(f"autopipe: error: {why}", file=sys.stderr)
        return EXIT_FAILED_RUN


if __name__ == "__main__":
    sys.exit(main())
