"""One rank of a pipeline run: ``python -m autopipe.runtime plan.json --steps N``.

The flags and their defaults are ``autopipe run``'s (:mod:`autopipe.runtime.run.options`).

The torchrun entry point (reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``)::

    torchrun --nnodes 2 --nproc-per-node 4 ... -m autopipe.runtime plan.json --steps 100

Rank 0 prints the measured-vs-predicted report. ``autopipe run`` starts the same entry point
on this machine with ``--result-dir``, where each rank writes its result or its error.
A failing rank prints ``autopipe: error: rank R failed: ...`` and exits 1; a bad flag or a
``--resume`` folder that cannot be resumed is ``autopipe: error: ...`` and exit 2. Under torchrun
(no launcher checked the folder) each rank hashes the checkpoint files it loads before its first
step and the ranks agree: every rank refuses, with the first refusal's line.

After its last step every rank passes an end-of-run barrier with the run's timeout (each rank
tells rank 0 it is done, rank 0 answers all), so a rank that finished cannot leave while a peer
is stuck in the last step: it fails naming the peer it waited for. A rank started by ``autopipe
run`` (``AUTOPIPE_LAUNCHER_PID`` set) dies with its launcher: SIGKILL when the parent dies
(Linux ``PR_SET_PDEATHSIG``), and everywhere an exit when its standard input, a pipe only the
launcher holds, closes.

Tests: tests/runtime/run/test_launch.py.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from autopipe._io import atomic_write_text
from autopipe.runtime.run.options import LAUNCHER_ENV, RunOptions, add_run_arguments, run_options

if TYPE_CHECKING:
    import torch

    from autopipe.runtime.comm import DistComm
    from autopipe.runtime.run.worker import RankResult

_END_TAG = 2**30  # the end-of-run messages' tag (every message of the steps is read by then)


def build_parser() -> argparse.ArgumentParser:
    """The run flags (:func:`~autopipe.runtime.run.options.add_run_arguments`, as ``autopipe run``'s)
    and the launcher's hidden ``--result-dir``."""
    p = argparse.ArgumentParser(prog="python -m autopipe.runtime", description="Run one rank of an autopipe plan.")
    add_run_arguments(p)
    p.add_argument(  # as autopipe run's (cli/common.py); launched ranks get the launcher's in the environment
        "--load-timeout",
        default=None,
        metavar="SECONDS",
        help="seconds each call into the model file may take (default: 300; 0: no limit)",
    )
    p.add_argument("--result-dir", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    if os.environ.get(LAUNCHER_ENV):
        _follow_launcher(os.environ[LAUNCHER_ENV])
    args = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    out = Path(args.result_dir) if args.result_dir else None
    model_file = Path(args.plan)
    try:
        import torch

        from autopipe.plans import Plan

        options = run_options(args)
        torch.set_num_threads(options.threads)
        from autopipe.model.usercode import LOAD_TIMEOUT_ENV, env_load_timeout, load_timeout

        plan = Plan.load(args.plan)
        model_file = Path(plan.recipe.model_file)
        limit: float | None
        if args.load_timeout is not None:
            limit = _seconds(args.load_timeout)
        else:  # autopipe run's --load-timeout, or the default
            limit = env_load_timeout(os.environ.get(LOAD_TIMEOUT_ENV))
        with load_timeout(limit, "--load-timeout"):
            result = _run(plan, rank, options)
    except BaseException as e:  # report every failure as one line, then leave at once
        _fail(rank, e, model_file, out)
    from autopipe.runtime.run.records import rank_to_dict

    if out is not None:
        atomic_write_text(out / f"rank-{rank}.json", json.dumps(rank_to_dict(result)))
    else:
        try:
            _report(plan, rank, result, args.trace)
        except BaseException as e:
            _fail(rank, e, model_file, out)
    os._exit(0)  # skip process-group teardown (a peer may already be gone)


def _seconds(text: str) -> float:
    from autopipe.errors import RunOptionError

    try:
        return float(text)
    except ValueError:
        said = f"--load-timeout must be a number of seconds, like 300 (0: no limit) (got {text!r})"
        raise RunOptionError(said) from None


def _run(plan: object, rank: int, options: RunOptions) -> RankResult:
    import torch
    import torch.distributed as dist

    from autopipe.errors import RunOptionError, RuntimeFailure
    from autopipe.plans import Plan
    from autopipe.runtime.comm import DistComm
    from autopipe.runtime.run.worker import train_rank

    assert isinstance(plan, Plan)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != plan.devices:
        raise RuntimeFailure(
            f"the plan needs {plan.devices} ranks but WORLD_SIZE is {world}; start {plan.devices} processes"
        )
    if options.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "nccl" if options.device == "cuda" else "gloo"
    launched = bool(os.environ.get(LAUNCHER_ENV))  # autopipe run checked the checkpoint whole before
    refusal = _resume_refusal(plan, rank, options) if options.resume and not launched else None
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=options.timeout_s))
    if options.resume and not launched:  # every rank refuses, with the first refusal's line
        said: list[object] = [None] * world
        dist.all_gather_object(said, refusal)
        first = next((s for s in said if isinstance(s, str)), None)
        if first is not None:
            raise RunOptionError(first)
    holder: list[DistComm] = []

    def comm(groups: list[tuple[int, ...]]) -> DistComm:
        holder.append(DistComm(options.timeout_s, groups))
        return holder[0]

    result = train_rank(plan, rank, comm, replace(options))
    device = torch.device("cuda", torch.cuda.current_device()) if options.device == "cuda" else None
    _end_barrier(holder[0] if holder else DistComm(options.timeout_s), rank, world, device)
    return result


def _resume_refusal(plan: object, rank: int, options: RunOptions) -> str | None:
    """Why this rank cannot resume ``options.resume`` (None if it can): the checkpoint is of
    another plan, or one of this rank's files does not match its SHA-256 (torchrun: no launcher
    checked the folder; each rank hashes only the files it loads). The folder's listing, sizes
    and links were checked with the flags (:func:`~autopipe.runtime.run.options.check_options`)."""
    from autopipe.errors import RunOptionError, RuntimeFailure
    from autopipe.plans import Plan
    from autopipe.runtime.checkpoint import read_meta, verify_files
    from autopipe.runtime.run.options import check_resume_plan

    assert isinstance(plan, Plan) and options.resume is not None
    own = [f"stage-{s.index}.pt" for s in plan.stages if s.rank == rank] + [f"rank-{rank}.pt"]
    try:
        meta = read_meta(options.resume)
        check_resume_plan(options, plan, meta)
        verify_files(options.resume, meta, own)
    except RunOptionError as e:
        return str(e)
    except RuntimeFailure as e:
        return f"--resume: {e}"
    return None


def _end_barrier(comm: DistComm, rank: int, world: int, device: torch.device | None = None) -> None:
    """Wait, at most the timeout, until every rank has finished its steps: each tells rank 0,
    rank 0 answers each (one-element tensors on ``device``, as NCCL needs). A
    CommunicationError names the rank that did not come."""
    import torch

    from autopipe.errors import CommunicationError

    def token() -> torch.Tensor:
        return torch.zeros(1, device=device)

    try:
        if rank == 0:
            for work in [comm.irecv(token(), r, _END_TAG) for r in range(1, world)]:
                work.wait()
            sends = [comm.isend(token(), r, _END_TAG) for r in range(1, world)]
        else:
            sends = [comm.isend(token(), 0, _END_TAG)]
            comm.irecv(token(), 0, _END_TAG).wait()
        for work in sends:
            work.wait()
    except CommunicationError as e:
        raise CommunicationError(f"rank {rank} finished, but waiting for the others: {e}") from e


def _follow_launcher(launcher: str) -> None:
    """Die with the ``autopipe run`` process that started this rank (pid ``launcher``)."""
    if sys.platform.startswith("linux"):
        try:  # SIGKILL when the parent dies
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if str(os.getppid()) != launcher:  # it died before the request: nobody would signal us
        os._exit(1)

    def exit_when_closed() -> None:
        try:
            while os.read(0, 4096):  # the launcher never writes: EOF means it is gone
                pass
        except OSError:
            pass
        os._exit(1)

    threading.Thread(target=exit_when_closed, name="autopipe-launcher-watch", daemon=True).start()


def _report(plan: object, rank: int, result: object, trace: str | None) -> None:
    """torchrun: gather every rank's result on rank 0, print the report, write the trace."""
    import torch.distributed as dist

    from autopipe.plans import Plan
    from autopipe.runtime.run.records import RunResult, rank_from_dict, rank_to_dict
    from autopipe.runtime.run.report import format_report, write_chrome_trace
    from autopipe.runtime.run.worker import RankResult

    assert isinstance(plan, Plan) and isinstance(result, RankResult)
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rank_to_dict(result))
    if rank == 0:
        run = RunResult(tuple(rank_from_dict(d) for d in gathered if isinstance(d, dict)))
        print(format_report(plan, run), flush=True)
        if trace:
            write_chrome_trace(run, trace)


def _fail(rank: int, e: BaseException, model_file: Path, out: Path | None) -> None:
    from autopipe.errors import AutopipeError, CommunicationError, RunOptionError
    from autopipe.model.usercode import exception_summary

    if isinstance(e, AutopipeError):
        message = f"{type(e).__name__}: {e}" if not isinstance(e, CommunicationError) else str(e)
    elif isinstance(e, KeyboardInterrupt):
        message = "interrupted"
    else:
        message = exception_summary(e, model_file)
    kind = "comm" if isinstance(e, CommunicationError) or _looks_like_comm(e) else "user"
    if out is not None:
        atomic_write_text(out / f"error-{rank}.json", json.dumps({"kind": kind, "message": message}))
    if isinstance(e, RunOptionError):  # bad input, refused before any step: as the CLI says it
        print(f"autopipe: error: {e}", file=sys.stderr, flush=True)
        os._exit(2)
    print(f"autopipe: error: rank {rank} failed: {message}", file=sys.stderr, flush=True)
    os._exit(1)


def _looks_like_comm(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return any(w in text for w in ("gloo", "nccl", "connection", "timed out", "distnetworkerror", "socket"))
