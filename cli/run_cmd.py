"""``autopipe run``: execute a plan on local processes and print measured against predicted.

The run flags and their defaults are defined once, in :mod:`autopipe.runtime.run.options`
(``python -m autopipe.runtime`` takes the same); ``--json`` and ``--plot`` are this command's
own. The flags, the plan and the plan against its rebuilt model are all checked here, in the
launcher, before any rank starts: a bad plan is one line and exit 2 within seconds. Progress (a
bar on a terminal, one line per step otherwise) and notes go to stderr; with ``--json`` stdout
holds one JSON object and nothing else.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from autopipe.errors import RunOptionError
from autopipe.runtime.run.options import add_run_arguments

from .args import output_path
from .common import add_load_timeout_argument

__all__ = ["add_run_parser"]


def add_run_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "run",
        help="train with a plan on this machine; print measured vs predicted times",
        description="Start one process per pipeline device (gloo on CPU, NCCL on GPUs), run PLAN for --steps "
        "optimizer steps (on the model file's train_data() when it has one, else its example_inputs()) and print "
        "each stage's measured time, the bubble, iteration time and memory beside the plan's prediction, and the "
        "loss of every step. Across machines use: torchrun ... -m autopipe.runtime PLAN.",
    )
    add_run_arguments(p)
    p.add_argument(
        "--json", action="store_true", help="print one JSON object on stdout (progress and notes go to stderr)"
    )
    p.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="draw the loss per step to PNG (needs matplotlib: pip install 'autopipe[plot]')",
    )
    add_load_timeout_argument(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from autopipe.runtime.run.options import run_options

    options = run_options(args)
    if args.trace:
        output_path(args.trace, "--trace")
    if args.plot:
        output_path(args.plot, "--plot")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise RunOptionError(
                "--plot needs matplotlib, which is not installed; pip install 'autopipe[plot]' or drop --plot"
            ) from None
    from autopipe.plans import Plan
    from autopipe.runtime.run.report import (
        format_report,
        summary,
        write_chrome_trace,
        write_loss_plot,
    )
    from autopipe.runtime.run.worker import rebuild

    plan = Plan.load(args.plan)  # the plan's fields, checked
    rebuilt = rebuild(plan, options.seed, options.model_base)  # the plan against its model, before any rank starts
    if rebuilt.loaded.make_train_data is not None:  # and the data: its first batch, as every rank will draw it
        from autopipe.runtime.run.data import BatchSource

        BatchSource(rebuilt.loaded, plan.batch_size, options.seed).batch(0)
    with tempfile.TemporaryDirectory(prefix="autopipe-progress-") as tmp:
        progress = Path(tmp) / "progress.jsonl"
        progress.touch()
        result = _run_with_progress(args.plan, replace(options, progress_file=str(progress)), err)
    if args.trace:
        write_chrome_trace(result, args.trace)
    if args.plot:
        write_loss_plot(list(result.losses), args.plot, f"{Path(args.plan).name}: {result.ranks[0].engine} engine")
    if args.json:
        print(json.dumps(summary(plan, result), indent=1), file=out.file)
    else:
        print(format_report(plan, result), file=out.file)
    return 0


def _run_with_progress(plan_path: str, options: Any, err: Console) -> Any:
    """``launch`` (in this, the main thread: it installs the SIGINT/SIGTERM handlers that end the
    ranks); its rank 0's notes and steps shown on stderr by a thread as they come."""
    from autopipe.runtime.run.launch import launch

    done = threading.Event()
    show = _Shower(err, options.steps)

    def follow() -> None:
        seen = 0
        while True:
            finished = done.is_set()
            try:
                with open(options.progress_file) as f:
                    lines = f.readlines()
            except FileNotFoundError:  # the launcher removed its folder: the run ended (a signal)
                return
            for line in lines[seen:]:
                if line.endswith("\n"):
                    kind, text = json.loads(line)
                    show.event(kind, text)
                    seen += 1
            if finished:
                return
            done.wait(0.1)

    thread = threading.Thread(target=follow, daemon=True)
    with show:
        thread.start()
        try:
            return launch(plan_path, options)
        finally:
            done.set()
            thread.join(timeout=5)


class _Shower:
    """A rich progress bar when stderr is a terminal; otherwise one line per step."""

    def __init__(self, err: Console, steps: int) -> None:
        self.err, self.steps, self.done = err, steps, 0
        self.bar: Any = None
        if err.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err,
                transient=True,
            )
            self.task = self.bar.add_task("training", total=steps)

    def __enter__(self) -> None:
        if self.bar is not None:
            self.bar.start()

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def event(self, kind: str, text: str) -> None:
        if kind == "note":
            self.err.print(f"autopipe: {text}", markup=False, highlight=False, soft_wrap=True)
            return
        step, loss = text.split()
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, description=f"step {int(step) + 1} loss {float(loss):.4f}")
        else:
            self.err.print(
                f"step {int(step) + 1} ({self.done}/{self.steps}) loss {float(loss):.6g}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
