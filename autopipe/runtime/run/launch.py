"""Start a plan's ranks as processes on this machine, watch them, collect their results.

``launch(plan, options)`` starts ``S`` processes of ``python -m autopipe.runtime`` — the
torchrun entry point — with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR=127.0.0.1``/``MASTER_PORT``
(a free port) set, one thread each (gloo on CPU; NCCL and ``cuda:LOCAL_RANK`` with
``device="cuda"``). Each rank writes its result (or its error, one line) to a private folder.
The options are checked here first (:func:`~autopipe.runtime.run.options.check_launch`), so a bad
flag is one line before any rank starts.

Faults: the launcher polls the children. The first rank that exits non-zero ends the run: the
others are killed and :class:`~autopipe.errors.RuntimeFailure` names the rank and its error.
When several fail together (a rank raised, its peers then lost their connection), the cause is
chosen over its consequences: an error raised by the rank itself first, then a rank killed by
a signal, then communication errors. When the only errors are lost peers (timeouts) and a rank
is still running, that rank hung: it is the one named (the one the errors name first).

Nothing waits for ever. Every send, receive and collective of a rank has the run's timeout, and
so has the end-of-run barrier every rank passes before it reports (a rank hung in the last
step's backward is named by the peer that waited for it there). Once a rank has finished, the
launcher gives the others ``timeout_s`` (plus a few seconds) to finish too, then kills them and
names the first still running ("rank 0 failed: it stopped responding").

Stopping: every rank runs in its own session (process group), so a Ctrl-C at the terminal
reaches the launcher only. On SIGINT or SIGTERM the launcher kills every rank's process group
and then stops: SIGINT raises ``KeyboardInterrupt`` (``autopipe run`` prints one line,
``autopipe: interrupted``, and exits 130), SIGTERM is delivered again with the caller's handler
(by default the launcher dies of it, exit status 143 in a shell). The handlers are installed
for the duration of :func:`launch` only (from the main thread; elsewhere the caller's own stay).
Once its ranks are dead, however the run ended, the launcher removes the unfinished new folders
their ``--save-checkpoint`` left (:func:`autopipe.runtime.commit.clean_leftovers`).
When the launcher dies without cleaning up (SIGKILL), its ranks die with it: a launched rank
asks Linux for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``) and, on every platform,
watches its standard input, a pipe only the launcher holds, and exits when it closes
(:mod:`autopipe.runtime.run.rank`; never under torchrun). What the ranks started, and the run's
temporary folders, go with them: at the end of every run the launcher kills each rank's whole
process group (finished ranks' included) and, on Linux, every process that carries the run's
marker in its environment (``AUTOPIPE_RUN_ID``, which all a rank starts inherits: a process that
left the group with ``setsid`` goes too, :func:`autopipe.runtime.run.reaper.sweep`); a small
reaper process of its own session (:mod:`autopipe.runtime.run.reaper`) does the same, and removes
the folders, when the launcher dies before it could (SIGKILL, or SIGTERM's default action).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from autopipe.errors import RuntimeFailure
from autopipe.model.usercode import LOAD_TIMEOUT_ENV, current_load_timeout
from autopipe.plans import Plan
from autopipe.runtime.run.options import LAUNCHER_ENV, RunOptions, check_launch, worker_arguments
from autopipe.runtime.run.reaper import RUN_ENV, sweep
from autopipe.runtime.run.records import RunResult, rank_from_dict

_log = logging.getLogger("autopipe")

__all__ = ["free_port", "launch", "worker_arguments"]

_POLL_S = 0.05
_GRACE_S = 0.5  # after the first failure, wait this long for the others to report theirs
_LATE_S = 5.0  # after a rank has finished, the others get the timeout plus this long


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def launch(plan: Plan | str | Path, options: RunOptions) -> RunResult:
    """Run ``plan`` on ``plan.devices`` local processes; RuntimeFailure if any rank fails,
    RunOptionError (before any rank starts) if an option cannot work."""
    with tempfile.TemporaryDirectory(prefix="autopipe-run-") as tmp:
        if isinstance(plan, Plan):
            plan_path = str(Path(tmp) / "plan.json")
            plan.save(plan_path)
        else:
            plan_path = str(plan)
            plan = Plan.load(plan_path)
        world = plan.devices
        check_launch(options, plan)
        if plan.data_parallel > 1:
            _log.warning(
                f"the plan has {plan.data_parallel} data-parallel replicas; this run trains one of them "
                f"({world} ranks, batch {plan.batch_size}) and no gradient all-reduce between replicas "
                "(the whole layout: autopipe config PLAN --for megatron or --for torchtitan)"
            )
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "autopipe.runtime",
            *worker_arguments(plan_path, options),
            "--result-dir",
            tmp,
        ]
        procs: list[subprocess.Popen[bytes]] = []
        run_id = f"{os.getpid()}-{secrets.token_hex(6)}"
        reaper = _start_reaper([tmp, f"run:{run_id}", *_progress_folder(options), *_checkpoint_leftovers(options)])
        with _Stopper(procs, reaper, lambda: _clean(options), run_id) as stopper:
            for rank in range(world):
                env = {
                    **os.environ,
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world),
                    "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "OMP_NUM_THREADS": str(options.threads),
                    LAUNCHER_ENV: str(os.getpid()),
                    RUN_ENV: run_id,  # inherited by all a rank starts: what sweep() kills at the end
                    LOAD_TIMEOUT_ENV: str(current_load_timeout() or 0),  # the ranks load the model file too
                }
                with open(Path(tmp) / f"log-{rank}.txt", "wb") as log, stopper.holding():
                    # stdin: a pipe only this process holds; the rank exits when it closes.
                    procs.append(
                        subprocess.Popen(
                            cmd,
                            env=env,
                            stdin=subprocess.PIPE,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
                    _tell(reaper, f"{procs[-1].pid}\n")
            _watch(procs, Path(tmp), options.timeout_s + _LATE_S)
        ranks = [json.loads((Path(tmp) / f"rank-{r}.json").read_text()) for r in range(world)]
    return RunResult(tuple(rank_from_dict(r) for r in ranks))


_REAPER = Path(__file__).with_name("reaper.py")


def _progress_folder(options: RunOptions) -> list[str]:
    """The folder ``autopipe run`` made for the progress file (``autopipe-progress-*``), if that is where it is."""
    if options.progress_file is None:
        return []
    folder = Path(options.progress_file).parent
    return [str(folder)] if folder.name.startswith("autopipe-progress-") else []


def _checkpoint_leftovers(options: RunOptions) -> list[str]:
    """What the reaper removes of the saves a killed launcher's ranks had begun: the new and old
    folders beside ``--save-checkpoint``'s whose token is a rank's pid (rank 0's is the one)."""
    if not options.save_checkpoint:
        return []
    import glob

    from autopipe.runtime.commit import save_prefix, target_of

    target = target_of(options.save_checkpoint)
    return [f"after-pid:{glob.escape(save_prefix(target, kind))}" for kind in ("new", "old")]


def _start_reaper(folders: list[str]) -> subprocess.Popen[bytes] | None:
    """:mod:`autopipe.runtime.run.reaper` for this run's ``folders`` (None if it cannot start: the run
    goes on, only a SIGKILL of the launcher would then leave them)."""
    try:
        return subprocess.Popen(
            [sys.executable, "-I", str(_REAPER), *folders],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None


def _tell(reaper: subprocess.Popen[bytes] | None, line: str) -> None:
    if reaper is not None and reaper.stdin is not None:
        try:
            reaper.stdin.write(line.encode())
            reaper.stdin.flush()
        except OSError:  # it died: nothing to tell
            pass


def _close(reaper: subprocess.Popen[bytes]) -> None:
    try:
        if reaper.stdin is not None:
            reaper.stdin.close()
        reaper.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        reaper.kill()


class _Signalled(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_Handler = Callable[[int, FrameType | None], Any] | int | None


class _Stopper:
    """``with _Stopper(procs):`` kills ``procs`` (each rank's process group) when the block
    ends, however it ends, and ends the block on SIGINT or SIGTERM (handlers installed for the
    block's duration, from the main thread). ``holding()`` defers a signal to the end of a
    step that must not be cut in two (starting a rank and recording it)."""

    def __init__(
        self,
        procs: list[subprocess.Popen[bytes]],
        reaper: subprocess.Popen[bytes] | None = None,
        cleanup: Callable[[], object] = lambda: None,
        run_id: str | None = None,
    ) -> None:
        self.procs = procs
        self.run_id = run_id  # its processes' environment marker (sweep), None: the groups only
        self.reaper = reaper
        self.cleanup = cleanup  # run once the ranks are dead, however the block ends
        self.signum: int | None = None
        self.held = False
        self.previous: dict[int, _Handler] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:  # later signals, while the ranks are being killed, change nothing
            self.signum = signum
            if not self.held:
                raise _Signalled(signum)

    @contextmanager
    def holding(self) -> Iterator[None]:
        self.held = True
        try:
            yield
        finally:
            self.held = False
        if self.signum is not None:
            raise _Signalled(self.signum)

    def __enter__(self) -> _Stopper:
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        self.signum = self.signum or 0  # from here on a signal changes nothing
        _kill(self.procs)
        if self.run_id is not None:  # what left the ranks' groups (setsid, daemons) goes too
            sweep(self.run_id)
        self.cleanup()
        if self.reaper is not None:
            dying = isinstance(error, _Signalled) and error.signum != signal.SIGINT
            if not dying:  # the folders are removed as this returns: the reaper does nothing
                _tell(self.reaper, "done\n")
            _close(self.reaper)  # dying (SIGTERM's default action, below, skips every cleanup): the reaper's
        for s, handler in self.previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if isinstance(error, _Signalled):
            if error.signum == signal.SIGINT:
                raise KeyboardInterrupt from None
            signal.raise_signal(error.signum)  # the caller's handler, or death by SIGTERM (default)
            name = signal.Signals(error.signum).name
            raise RuntimeFailure(f"stopped by {name}; every rank was killed") from None


def _clean(options: RunOptions) -> None:
    """Remove what the killed or failed ranks' saves left beside ``--save-checkpoint``'s folder."""
    if options.save_checkpoint:
        from autopipe.runtime.commit import clean_leftovers

        try:
            clean_leftovers(options.save_checkpoint)
        except OSError:
            pass


def _watch(procs: list[subprocess.Popen[bytes]], folder: Path, late_s: float) -> None:
    """Wait for every rank to exit 0; a RuntimeFailure when one fails, or when one still runs
    ``late_s`` seconds after another finished."""
    finished_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        quit = [r for r, c in enumerate(codes) if c == 0 and not (folder / f"rank-{r}.json").is_file()]
        if quit:  # exit status 0 but no result: it left the run (sys.exit(0), os._exit(0) in the model's code)
            raise RuntimeFailure(
                f"rank {quit[0]} failed: it exited with code 0 before its last step, without a result "
                "(sys.exit(0) or os._exit(0) in the model's code?); its peers were stopped",
                rank=quit[0],
            )
        if any(c not in (None, 0) for c in codes):
            time.sleep(_GRACE_S)
            codes = [p.poll() for p in procs]
            raise _failure(codes, folder)
        if all(c == 0 for c in codes):
            return
        if finished_at is None and 0 in codes:
            finished_at = time.monotonic()
        if finished_at is not None and time.monotonic() - finished_at > late_s:
            late = codes.index(None)
            done = codes.index(0)
            raise RuntimeFailure(
                f"rank {late} failed: it stopped responding (rank {done} finished "
                f"{late_s:g}s before and rank {late} has not finished since)",
                rank=late,
            )
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
    """SIGKILL each rank's process group -- the rank if it still runs, and anything it started, whether
    it failed or finished (a group outlives its leader while a member lives); wait."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:  # the whole group is gone (or never: not a group leader, start_new_session)
            if p.poll() is None:
                p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if p.stdin is not None:
            p.stdin.close()
