"""The options of a pipeline run, and the run flags, defined once.

``autopipe run PLAN`` and ``python -m autopipe.runtime PLAN`` (one rank, what torchrun and
:func:`autopipe.runtime.run.launch.launch` start) take the same flags with the same defaults, added
by :func:`add_run_arguments` and read back by :func:`run_options`; the launcher writes them
with :func:`worker_arguments`, every option explicit. The flags' defaults are ``autopipe
run``'s (10 steps, CUDA when available); :class:`RunOptions`' own defaults serve Python
callers (one step on the CPU).

Every value is checked before any rank starts (:func:`check_options`, called by
:func:`run_options`; :func:`check_launch` adds the checks that need the plan), each failure a
:class:`~autopipe.errors.RunOptionError`: one line saying what is wrong and how to fix it.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autopipe.errors import AutopipeError, RunOptionError
from autopipe.modes import Engine
from autopipe.units import COUNT_BOUNDS, parse_duration

if TYPE_CHECKING:
    from autopipe.plans import Plan

__all__ = [
    "DEFAULT_STEPS",
    "LAUNCHER_ENV",
    "RunOptions",
    "add_run_arguments",
    "check_launch",
    "check_options",
    "check_resume_plan",
    "run_options",
    "worker_arguments",
]

DEFAULT_STEPS = 10  # the run flags' --steps
LAUNCHER_ENV = "AUTOPIPE_LAUNCHER_PID"  # set by autopipe run for its ranks: the launcher's pid
MAX_STEPS = COUNT_BOUNDS["steps"][1]
MAX_SEED = 2**64 - 1  # torch.manual_seed's largest; step k's batches use seed + k + 1
MAX_TIMEOUT_S = 7 * 86400.0
MAX_THREADS = COUNT_BOUNDS["threads"][1]


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
    engine: Engine = Engine.AUTOPIPE  # autopipe (the built-in executor) or torch (torch.distributed.pipelining)
    progress_file: str | None = None  # rank 0 appends its notes and per-step losses here (autopipe run)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """PLAN and the run flags. Values are read as text and checked by :func:`run_options`, so a
    bad one is one clear line (a :class:`~autopipe.errors.RunOptionError`)."""
    base = RunOptions()
    p.add_argument("plan", metavar="PLAN", help="plan JSON written by autopipe plan")
    p.add_argument(
        "--steps", default=str(DEFAULT_STEPS), metavar="N", help=f"optimizer steps (default: {DEFAULT_STEPS})"
    )
    p.add_argument(
        "--timeout",
        default=f"{base.timeout_s:g}",
        metavar="SECONDS",
        help=f"timeout of every send/receive/collective (default: {base.timeout_s:g})",
    )
    p.add_argument(
        "--seed", default=str(base.seed), metavar="N", help=f"seed for weights and batches (default: {base.seed})"
    )
    p.add_argument("--optimizer", default=base.optimizer, help=f"torch.optim class (default: {base.optimizer})")
    p.add_argument("--lr", default=f"{base.lr:g}", help=f"learning rate (default: {base.lr:g})")
    p.add_argument(
        "--optimizer-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra optimizer argument, a number (repeatable), e.g. --optimizer-arg momentum=0.9",
    )
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default=None, help="cpu (gloo) or cuda (NCCL) (default: cuda if available)"
    )
    p.add_argument(
        "--threads", default=str(base.threads), metavar="N", help=f"CPU threads per rank (default: {base.threads})"
    )
    p.add_argument("--trace", default=None, metavar="FILE", help="write a Chrome trace (chrome://tracing, Perfetto)")
    p.add_argument(
        "--save-checkpoint",
        default=None,
        metavar="DIR",
        help="save weights and optimizer state after the run (DIR is replaced whole, or not at all)",
    )
    p.add_argument(
        "--resume",
        default=None,
        metavar="DIR",
        help="continue from a checkpoint (checked against its manifest; this run's optimizer flags apply)",
    )
    p.add_argument(
        "--engine",
        choices=("autopipe", "torch"),
        default=base.engine,
        help="autopipe (the built-in executor) or torch (torch.distributed.pipelining) (default: autopipe)",
    )
    p.add_argument("--progress-file", default=None, help=argparse.SUPPRESS)


def run_options(args: argparse.Namespace) -> RunOptions:
    """The :class:`RunOptions` of parsed run flags (``--device`` left out: CUDA when available)."""
    device = args.device
    if device is None:
        import torch  # here, so that parsing the flags does not wait for torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    options = RunOptions(
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
        engine=Engine(args.engine),
        progress_file=args.progress_file,
    )
    check_options(options)
    return options


def check_options(o: RunOptions) -> None:
    """RunOptionError unless every option can work: numbers in range, an optimizer that takes
    its arguments, a checkpoint to resume, a folder to save into, the device."""
    if o.engine != "autopipe" and (o.save_checkpoint or o.resume):
        raise RunOptionError(
            "--save-checkpoint and --resume work with --engine autopipe only; drop them or the --engine flag"
        )
    if not 1 <= o.steps <= MAX_STEPS:
        raise RunOptionError(
            f"--steps must be from 1 to {MAX_STEPS} (got {o.steps}); run longer as several runs "
            "with --save-checkpoint and --resume"
        )
    if not 0 <= o.seed <= MAX_SEED - o.steps:
        raise RunOptionError(
            f"--seed must be from 0 to {MAX_SEED - o.steps} with --steps {o.steps} (got {o.seed}; "
            f"step k seeds torch with seed + k + 1, at most {MAX_SEED})"
        )
    if not 0 < o.timeout_s <= MAX_TIMEOUT_S:  # False for NaN too
        raise RunOptionError(
            f"--timeout must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds (a week), "
            f"like 60 or 500ms (got {o.timeout_s:g} seconds)"
        )
    if not 1 <= o.threads <= MAX_THREADS:
        raise RunOptionError(
            f"--threads must be from 1 to {MAX_THREADS} (got {o.threads}); this machine has {os.cpu_count()} CPUs"
        )
    if not (math.isfinite(o.lr) and o.lr >= 0):
        raise RunOptionError(f"--lr must be a finite number >= 0, like 1e-3 (got {o.lr:g})")
    _check_optimizer(o)
    if o.device not in ("cpu", "cuda"):
        raise RunOptionError(f"--device must be cpu or cuda (got {_shown(o.device)})")
    if o.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RunOptionError(
                f"--device cuda: CUDA is not available on this machine (torch {torch.__version__}); use --device cpu"
            )
    if o.resume is not None:
        from autopipe.runtime.run.resume import check_resume

        check_resume(o, MAX_SEED)
    if o.save_checkpoint is not None:
        _check_save_folder(o.save_checkpoint)


def check_launch(o: RunOptions, plan: Plan) -> None:
    """:func:`check_options` and what needs the plan: a GPU per rank, a checkpoint of this plan."""
    check_options(o)  # --engine torch runs every schedule (those without a torch class as a schedule CSV)
    from autopipe.runtime.pipeline import executor_refusal

    refusal = executor_refusal(plan)
    if refusal is not None:
        raise RunOptionError(refusal)
    if o.engine is Engine.TORCH:
        from autopipe.schedules.torch_limits import torch_refusal

        refusal = torch_refusal(plan.schedule, plan.devices, plan.micro_batches, len(plan.stages))
        if refusal is not None:
            raise RunOptionError(f"--engine torch: {refusal}")
    if o.device == "cuda":
        import torch

        if torch.cuda.device_count() < plan.devices:
            raise RunOptionError(
                f"--device cuda: the plan needs {plan.devices} GPUs, this machine has {torch.cuda.device_count()}; "
                "plan for fewer devices or use --device cpu"
            )
    if o.resume is not None:
        from autopipe.runtime.run.resume import check_resume

        check_resume_plan(o, plan, check_resume(o, MAX_SEED, hashes=True))


def check_resume_plan(o: RunOptions, plan: Plan, meta: Mapping[str, Any]) -> None:
    """RunOptionError unless the checkpoint ``meta`` (``--resume``'s manifest) is of ``plan``:
    its model, its stages, its ranks."""
    from autopipe.runtime.checkpoint import ranks_of

    assert o.resume is not None
    if meta["fingerprint"] != plan.recipe.fingerprint or meta["stages"] != len(plan.stages):
        raise RunOptionError(
            f"--resume {_shown(o.resume)}: the checkpoint was saved with another plan (model fingerprint "
            f"{meta['fingerprint']}, {meta['stages']} stages; this plan: {plan.recipe.fingerprint}, "
            f"{len(plan.stages)} stages); resume with the plan it was saved with"
        )
    if ranks_of(meta) != plan.devices:
        raise RunOptionError(
            f"--resume {_shown(o.resume)}: the checkpoint holds the optimizer state of {ranks_of(meta)} ranks, "
            f"this plan has {plan.devices}; resume with the plan it was saved with"
        )


def _check_save_folder(folder: str) -> None:
    """The folder is one, or can be made; it holds nothing but a checkpoint (a save replaces it
    whole); this process can write beside it (where the new folder is written, then renamed)."""
    from autopipe.runtime.commit import MAX_NAME_BYTES, foreign_entry, target_of

    path = Path(folder)
    if any(len(os.fsencode(part)) > MAX_NAME_BYTES for part in path.parts):  # before exists(), which raises on it
        raise RunOptionError(
            f"--save-checkpoint {_shown(folder)}: the name is longer than {MAX_NAME_BYTES} bytes "
            "(a save writes a new folder of a longer name beside it); give a shorter name"
        )
    try:
        is_file = path.exists() and not path.is_dir()
    except OSError as e:  # a loop of links, a path too long in all
        raise RunOptionError(f"--save-checkpoint {_shown(folder)}: cannot use it ({e.strerror})") from None
    if is_file:
        raise RunOptionError(f"--save-checkpoint {_shown(folder)} is a file; give a folder (made if missing)")
    target = target_of(folder)
    if target == target.parent:
        raise RunOptionError(f"--save-checkpoint {_shown(folder)}: give a folder below the root, like ./ckpt")
    if len(os.fsencode(target.name)) > MAX_NAME_BYTES:
        raise RunOptionError(
            f"--save-checkpoint {_shown(folder)}: the name is longer than {MAX_NAME_BYTES} bytes "
            "(a save writes a new folder of a longer name beside it); give a shorter name"
        )
    try:
        foreign = foreign_entry(target) if target.is_dir() else None
    except OSError as e:
        raise RunOptionError(f"--save-checkpoint {_shown(folder)}: cannot read it ({e.strerror})") from None
    if foreign is not None:
        raise RunOptionError(
            f"--save-checkpoint {_shown(folder)} holds {_shown(foreign)}, which is no checkpoint's file: a save "
            "replaces the folder whole; give a new or empty folder, or a checkpoint folder"
        )
    existing = target.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise RunOptionError(
            f"--save-checkpoint {_shown(folder)}: {_shown(str(existing))} is a file, "
            "so no folder can be made under it; "
            "give another folder"
        )
    try:  # writing is the only true test of writable (permissions, read-only mounts, root)
        os.rmdir(tempfile.mkdtemp(prefix=".autopipe-probe-", dir=existing))
    except OSError as e:
        raise RunOptionError(
            f"--save-checkpoint {_shown(folder)}: cannot write in {_shown(str(existing))} ({e.strerror}); "
            "give a folder you can write to"
        ) from None


def _check_optimizer(o: RunOptions) -> None:
    import torch

    cls = getattr(torch.optim, o.optimizer, None) if o.optimizer.isidentifier() else None
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or cls is torch.optim.Optimizer:
        raise RunOptionError(
            f"--optimizer {_shown(o.optimizer)} is not a torch.optim optimizer; name one such as SGD, Adam or AdamW"
        )
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key, value in o.optimizer_kwargs:
        if key in ("params", "lr"):
            fix = "give the learning rate with --lr" if key == "lr" else "autopipe passes the parameters"
            raise RunOptionError(f"--optimizer-arg {key}: {fix}")
        if key not in params and not takes_any:
            known = ", ".join(k for k in params if k not in ("params", "lr") and _numeric(params[k]))
            raise RunOptionError(f"--optimizer-arg {key}: {o.optimizer} takes no argument {key!r}; it takes {known}")
        if key in params and not _numeric(params[key]):
            default = params[key].default
            raise RunOptionError(
                f"--optimizer-arg {key}: {o.optimizer}'s {key} is a {type(default).__name__} (default {default!r}), "
                "which --optimizer-arg (one number) cannot give; leave it at its default"
            )
        if not math.isfinite(value):
            raise RunOptionError(f"--optimizer-arg {key}={value}: the value must be a finite number")
    if o.optimizer in _NO_PIPELINE:
        raise RunOptionError(f"--optimizer {o.optimizer}: {_NO_PIPELINE[o.optimizer]}; use SGD, Adam or AdamW")
    try:  # the optimizer's own checks (momentum >= 0, nesterov needs momentum...) and one step, on one tensor
        extra: dict[str, Any] = dict(o.optimizer_kwargs)
        device = o.device if o.device == "cpu" or torch.cuda.is_available() else "cpu"
        param = torch.zeros(1, requires_grad=True, device=device)
        optimizer = cls([param], lr=o.lr, **extra)  # type: ignore[call-arg]
        param.grad = torch.zeros_like(param)
        optimizer.step()  # capturable=1 on the CPU, for one, fails only here
    except Exception as e:
        from autopipe.model.usercode import first_line

        given = " ".join(f"{k}={v:g}" for k, v in o.optimizer_kwargs)
        why = first_line(e).rstrip(".")
        raise RunOptionError(
            f"--optimizer {o.optimizer} refuses --lr {o.lr:g}{' ' + given if given else ''}: {why}; fix the values"
        ) from None


_NO_PIPELINE = {  # torch.optim classes whose step a pipeline cannot drive, and why
    "LBFGS": "its step needs a closure that evaluates the loss again, which a pipeline step cannot give",
    "SparseAdam": "it takes only sparse gradients (nn.Embedding(sparse=True)), and a pipeline's are dense",
}


def _numeric(param: inspect.Parameter) -> bool:
    """Whether an optimizer argument takes one number (its default is one, or None/a bool flag)."""
    default = param.default
    return default is inspect.Parameter.empty or default is None or isinstance(default, (int, float))


def _shown(text: str) -> str:
    """``text`` quoted, shortened to stay one readable line."""
    return repr(text if len(text) <= 200 else text[:197] + "...")


def worker_arguments(plan_path: str, options: RunOptions) -> list[str]:
    """The run flags of ``python -m autopipe.runtime`` for ``options``, every one explicit
    (so a launched rank never falls back on a flag's default)."""
    args = [
        plan_path,
        "--steps",
        str(options.steps),
        "--seed",
        str(options.seed),
        "--timeout",
        str(options.timeout_s),
        "--optimizer",
        options.optimizer,
        "--lr",
        repr(options.lr),
        "--device",
        options.device,
        "--threads",
        str(options.threads),
    ]
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
        value = int(str(text).strip()) if len(str(text)) <= 100 else int("too long")
    except ValueError:
        raise RunOptionError(f"{flag} must be {what} (got {_shown(text)})") from None
    if value < minimum:
        raise RunOptionError(f"{flag} must be {what} (got {value})")
    return value


def _duration(text: str, flag: str) -> float:
    """Seconds, or a number with a unit (``500ms``); the range is :func:`check_options`' to check."""
    try:
        return float(text)  # NaN, infinities and 1e400 too: check_options says what is wrong
    except ValueError:
        pass
    try:
        return parse_duration(text, flag)
    except AutopipeError:  # units.py says PlanError, and "zero or more"; here it is a run flag
        raise RunOptionError(
            f"{flag} must be a positive number of seconds, or one with a unit, like 60 or 500ms (got {_shown(text)})"
        ) from None


def _number(text: str, flag: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise RunOptionError(f"{flag} must be a number (got {_shown(text)})") from None


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
