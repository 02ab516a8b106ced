"""Killing ``autopipe run --save-checkpoint DIR`` (the launcher, or a rank) at moments spread
over its save leaves DIR the previous checkpoint or the new one, whole (its manifest's every
file, sizes and SHA-256, nothing else), never a mix; nothing is left beside DIR once the
cleanup has run (the launcher's after a rank died or it got SIGTERM, its reaper's after the
launcher died). Every 50 ms of the save: tests/runtime/run/test_save_sweep.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from autopipe.runtime import RunOptions, run_threads
from autopipe.runtime.checkpoint import verify_folder
from autopipe.runtime.commit import leftovers
from tests.helpers import FIXTURES, even_plan

WIDTH = 2048  # 5 layers of 2048 x 2048: ~200 MB of weights and Adam state to write and hash
# (seconds after the new folder appears, whom to kill): the save takes about 0.8 s on an idle
# machine, each run about 10 s; the last kill comes after the run has ended (the new checkpoint
# is the one there)
KILLS = ((0.0, "launcher"), (0.1, 1), (0.3, 0), (0.45, "launcher SIGTERM"), (0.6, "launcher"), (3.0, 1))


def _children(pid: int) -> dict[int | str, int]:
    """The launcher's children: rank -> pid for its ranks, "other N" -> pid for the rest (its reaper)."""
    found: dict[int | str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for n, child in enumerate((task / "children").read_text().split()):
            try:
                env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            ranks = [e[5:] for e in env if e.startswith(b"RANK=")]
            found[int(ranks[0]) if ranks else f"other {n}"] = int(child)
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_gone(pids: Iterable[int]) -> None:
    deadline = time.monotonic() + 30
    while any(_running(p) for p in pids):
        assert time.monotonic() < deadline, "a rank outlived its launcher"
        time.sleep(0.01)


def _wait_for_save(ck: Path, proc: subprocess.Popen[bytes], before: set[Path]) -> None:
    """Until the run's new folder appears beside ``ck`` (its save has begun)."""
    deadline = time.monotonic() + 120
    while not set(leftovers(ck)) - before:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "the save never began"
        time.sleep(0.002)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_save_killed_at_any_moment_leaves_one_whole_checkpoint(tmp_path: Path) -> None:
    plan = even_plan(str(FIXTURES / "skip_mlp.py"), {"width": WIDTH, "depth": 2}, micro_batches=2, micro_batch_size=2)
    plan.save(tmp_path / "plan.json")
    ck = tmp_path / "ck"
    run_threads(plan, RunOptions(steps=1, timeout_s=60, save_checkpoint=str(ck)))
    step, outcomes = 1, []
    argv = [sys.executable, "-m", "autopipe.cli", "run", "plan.json", "--steps", "1", "--device", "cpu"]
    argv += ["--timeout", "60", "--resume", "ck", "--save-checkpoint", "ck"]
    for delay, victim in KILLS:
        before = set(leftovers(ck))
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_for_save(ck, proc, before)
            ranks = _children(proc.pid)
            time.sleep(delay)
            try:
                if victim == "launcher SIGTERM":  # the launcher kills its ranks, then cleans up
                    os.kill(proc.pid, signal.SIGTERM)
                else:
                    os.kill(proc.pid if victim == "launcher" else ranks[int(victim)], signal.SIGKILL)
            except ProcessLookupError:  # the run has ended by now
                pass
            proc.wait(60)
            _wait_gone(ranks.values())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        meta = verify_folder(ck)  # whole: every listed file, of its size and hash, and nothing else
        assert meta["step"] in (step, step + 1), (delay, victim)
        outcomes.append(meta["step"] - step)
        step = meta["step"]
        # the launcher removed what its killed ranks left; a killed launcher's reaper did
        assert leftovers(ck) == [], (delay, victim)
    assert sorted(os.listdir(tmp_path)) == ["ck", "plan.json"]
    assert 0 in outcomes and 1 in outcomes, outcomes  # the kills fell both before and after the commit
