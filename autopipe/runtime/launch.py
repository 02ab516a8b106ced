"""Start a plan's ranks as processes on this machine, watch them, collect their results.

``launch(plan, options)`` starts ``S`` processes of ``python -m autopipe.runtime`` — the
torchrun entry point — with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR=127.0.0.1``/``MASTER_PORT``
(a free port) set, one thread each (gloo on CPU; NCCL and ``cuda:LOCAL_RANK`` with
``device="cuda"``). Each rank writes its result (or its error, one line) to a private folder.

Faults: the launcher polls the children. The first rank that exits non-zero ends the run: the
others are killed and :class:`~autopipe.errors.RuntimeFailure` names the rank and its error.
When several fail together (a rank raised, its peers then lost their connection), the cause is
chosen over its consequences: an error raised by the rank itself first, then a rank killed by
a signal, then communication errors. When the only errors are lost peers (timeouts) and a rank
is still running, that rank hung: it is the one named (the one the errors name first). Ranks waiting on a dead or hung peer fail on their own
within ``timeout_s`` (every send, receive and collective has that timeout), so a run never hangs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autopipe.errors import RuntimeFailure
from autopipe.plans import Plan
from autopipe.runtime.options import RunOptions, worker_arguments
from autopipe.runtime.records import RunResult, rank_from_dict

__all__ = ["free_port", "launch", "worker_arguments"]

_POLL_S = 0.05
_GRACE_S = 0.5  # after the first failure, wait this long for the others to report theirs


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def launch(plan: Plan | str | Path, options: RunOptions) -> RunResult:
    """Run ``plan`` on ``plan.devices`` local processes; RuntimeFailure if any rank fails."""
    with tempfile.TemporaryDirectory(prefix="autopipe-run-") as tmp:
        if isinstance(plan, Plan):
            plan_path = str(Path(tmp) / "plan.json")
            plan.save(plan_path)
            world = plan.devices
        else:
            plan_path = str(plan)
            world = Plan.load(plan_path).devices
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "autopipe.runtime",
            *worker_arguments(plan_path, options),
            "--result-dir",
            tmp,
        ]
        procs = []
        try:
            for rank in range(world):
                env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": str(options.threads)}  # fmt: skip
                log = open(Path(tmp) / f"log-{rank}.txt", "wb")
                procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
                log.close()
            _watch(procs, Path(tmp))
        finally:
            _kill(procs)
        ranks = [json.loads((Path(tmp) / f"rank-{r}.json").read_text()) for r in range(world)]
    return RunResult(tuple(rank_from_dict(r) for r in ranks))


def _watch(procs: list[subprocess.Popen[bytes]], folder: Path) -> None:
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            time.sleep(_GRACE_S)
            codes = [p.poll() for p in procs]
            raise _failure(codes, folder)
        if all(c == 0 for c in codes):
            return
        time.sleep(_POLL_S)


def _failure(codes: list[int | None], folder: Path) -> RuntimeFailure:
    found: list[tuple[int, int, str]] = []  # (priority, rank, message)
    for rank, code in enumerate(codes):
        if code in (None, 0):
            continue
        err = folder / f"error-{rank}.json"
        if err.is_file():
            info = json.loads(err.read_text())
            found.append((0 if info["kind"] == "user" else 2, rank, info["message"]))
        else:
            found.append((1, rank, _describe_exit(code, folder / f"log-{rank}.txt")))
    priority, rank, message = min(found)
    running = [r for r, code in enumerate(codes) if code is None]
    if priority == 2 and running:  # only lost peers: a rank that still runs hung
        named = [r for r in running if re.search(rf"\brank {r}\b", message)]
        culprit = (named or running)[0]
        return RuntimeFailure(
            f"rank {culprit} failed: it stopped responding (rank {rank} gave up on it: {message})",
            rank=culprit,
        )
    return RuntimeFailure(f"rank {rank} failed: {message}", rank=rank)


def _describe_exit(code: int | None, log: Path) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    last = ""
    if log.is_file():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        last = f" ({lines[-1].strip()[:200]})" if lines else ""
    return f"exited with code {code}{last}"


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
