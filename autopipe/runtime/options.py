"""The options of a pipeline run, and the run flags, defined once.

``autopipe run PLAN`` and ``python -m autopipe.runtime PLAN`` (one rank, what torchrun and
:func:`autopipe.runtime.launch.launch` start) take the same flags with the same defaults, added
by :func:`add_run_arguments` and read back by :func:`run_options`; the launcher writes them
with :func:`worker_arguments`, every option explicit. The flags' defaults are ``autopipe
run``'s (10 steps, CUDA when available); :class:`RunOptions`' own defaults serve Python
callers (one step on the CPU).
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

from autopipe.errors import AutopipeError, RunOptionError
from autopipe.units import parse_duration

__all__ = ["DEFAULT_STEPS", "RunOptions", "add_run_arguments", "run_options", "worker_arguments"]

DEFAULT_STEPS = 10  # the run flags' --steps


@dataclass(frozen=True)
class RunOptions:
    steps: int = 1  # optimizer steps to run (after those of a resumed checkpoint)
    seed: int = 0  # weights: torch.manual_seed(seed) before the factory; batches: seed + step + 1
    optimizer: str = "Adam"  # a torch.optim class name
    lr: float = 1e-3
    optimizer_kwargs: tuple[tuple[str, float], ...] = ()  # extra constructor arguments
    timeout_s: float = 60.0  # every send, receive and collective; and starting the group
    device: str = "cpu"  # "cpu" (gloo) or "cuda" (NCCL, device cuda:LOCAL_RANK)
    threads: int = 1  # torch.set_num_threads per rank
    save_checkpoint: str | None = None  # folder written after the last step
    resume: str | None = None  # folder to continue from
    model_base: str | None = None  # where to look for a relative model_file besides the cwd (the plan's folder)
    engine: str = "autopipe"  # "autopipe" (the built-in executor) or "torch" (torch.distributed.pipelining)
    progress_file: str | None = None  # rank 0 appends its notes and per-step losses here (autopipe run)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """PLAN and the run flags. Values are read as text and checked by :func:`run_options`, so a
    bad one is one clear line (a :class:`~autopipe.errors.RunOptionError`)."""
    base = RunOptions()
    p.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    p.add_argument("--steps", default=str(DEFAULT_STEPS), metavar="N", help=f"optimizer steps (default: {DEFAULT_STEPS})")
    p.add_argument(
        "--timeout", default=f"{base.timeout_s:g}", metavar="SECONDS",
        help=f"timeout of every send/receive/collective (default: {base.timeout_s:g})",
    )  # fmt: skip
    p.add_argument("--seed", default=str(base.seed), metavar="N", help=f"seed for weights and batches (default: {base.seed})")
    p.add_argument("--optimizer", default=base.optimizer, help=f"torch.optim class (default: {base.optimizer})")
    p.add_argument("--lr", default=f"{base.lr:g}", help=f"learning rate (default: {base.lr:g})")
    p.add_argument(
        "--optimizer-arg", action="append", default=[], metavar="KEY=VALUE",
        help="extra optimizer argument, a number (repeatable), e.g. --optimizer-arg momentum=0.9",
    )  # fmt: skip
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default=None, help="cpu (gloo) or cuda (NCCL) (default: cuda if available)"
    )
    p.add_argument("--threads", default=str(base.threads), metavar="N", help=f"CPU threads per rank (default: {base.threads})")
    p.add_argument("--trace", default=None, metavar="FILE", help="write a Chrome trace (chrome://tracing, Perfetto)")
    p.add_argument("--save-checkpoint", default=None, metavar="DIR", help="save weights and optimizer state after the run")
    p.add_argument("--resume", default=None, metavar="DIR", help="continue from a checkpoint")
    p.add_argument(
        "--engine", choices=("autopipe", "torch"), default=base.engine,
        help="autopipe (the built-in executor) or torch (torch.distributed.pipelining) (default: autopipe)",
    )  # fmt: skip
    p.add_argument("--progress-file", default=None, help=argparse.SUPPRESS)


def run_options(args: argparse.Namespace) -> RunOptions:
    """The :class:`RunOptions` of parsed run flags (``--device`` left out: CUDA when available)."""
    device = args.device
    if device is None:
        import torch  # here, so that parsing the flags does not wait for torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return RunOptions(
        steps=_int(args.steps, "--steps", minimum=1),
        seed=_int(args.seed, "--seed", minimum=0),
        optimizer=args.optimizer,
        lr=_number(args.lr, "--lr"),
        optimizer_kwargs=_optimizer_kwargs(args.optimizer_arg),
        timeout_s=_duration(args.timeout, "--timeout"),
        device=device,
        threads=_int(args.threads, "--threads", minimum=1),
        save_checkpoint=args.save_checkpoint,
        resume=args.resume,
        model_base=str(Path(args.plan).resolve().parent),
        engine=args.engine,
        progress_file=args.progress_file,
    )


def worker_arguments(plan_path: str, options: RunOptions) -> list[str]:
    """The run flags of ``python -m autopipe.runtime`` for ``options``, every one explicit
    (so a launched rank never falls back on a flag's default)."""
    args = [plan_path, "--steps", str(options.steps), "--seed", str(options.seed), "--timeout", str(options.timeout_s),
            "--optimizer", options.optimizer, "--lr", repr(options.lr), "--device", options.device,
            "--threads", str(options.threads)]  # fmt: skip
    for k, v in options.optimizer_kwargs:
        args += ["--optimizer-arg", f"{k}={v!r}"]
    if options.save_checkpoint:
        args += ["--save-checkpoint", options.save_checkpoint]
    if options.resume:
        args += ["--resume", options.resume]
    args += ["--engine", options.engine]
    if options.progress_file:
        args += ["--progress-file", options.progress_file]
    return args


def _int(text: str, flag: str, minimum: int) -> int:
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    try:
        value = int(str(text).strip())
    except ValueError:
        raise RunOptionError(f"{flag} must be {what} (got {text!r})") from None
    if value < minimum:
        raise RunOptionError(f"{flag} must be {what} (got {value})")
    return value


def _duration(text: str, flag: str) -> float:
    try:
        return parse_duration(text, flag)
    except AutopipeError as e:  # units.py says PlanError; here it is a run flag
        raise RunOptionError(str(e)) from None


def _number(text: str, flag: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise RunOptionError(f"{flag} must be a number (got {text!r})") from None


def _optimizer_kwargs(items: list[str]) -> tuple[tuple[str, float], ...]:
    """``["momentum=0.9", "nesterov=True"]`` -> ``(("momentum", 0.9), ("nesterov", 1.0))``."""
    out: dict[str, float] = {}
    for item in items:
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not key.isidentifier():
            raise RunOptionError(f"--optimizer-arg {item!r}: write it as KEY=VALUE, like momentum=0.9")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value = raw
        if key in out:
            raise RunOptionError(f"--optimizer-arg {key} is given twice; give it once")
        if not isinstance(value, (int, float)):  # bools too (nesterov=True), as torch.optim takes them
            raise RunOptionError(f"--optimizer-arg {key}={raw}: the value must be a number, like {key}=0.9")
        out[key] = float(value)
    return tuple(out.items())
