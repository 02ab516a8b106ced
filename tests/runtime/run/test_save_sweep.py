"""A ``--save-checkpoint`` killed every 50 ms over its whole save leaves the previous checkpoint
or the new one, whole, never a mix, and nothing beside it.

The save is :func:`autopipe.runtime.commit.save` itself, run by two gloo ranks forked from this
process (each its own process group, as ``autopipe run`` starts its ranks), saving stage files
whose every value is the step, so a folder mixing two saves shows in its numbers as well as in
its manifest. The test plays the launcher around them, with the launcher's own cleanup code:

- ``rank R``: rank R gets SIGKILL; the launcher gives the other its grace to fail, kills its
  process group, then removes what the save left (:func:`autopipe.runtime.run.launch._clean`);
- ``launcher SIGTERM``: both ranks' groups killed, then the same cleanup (:class:`_Stopper`);
- ``launcher SIGKILL``: both ranks get SIGKILL at once (what ``PR_SET_PDEATHSIG`` sends them)
  and the launcher's reaper (autopipe/runtime/run/reaper.py, the real one) gets EOF.

The save window is measured once (from the new folder's appearance to the rank's exit), then
every victim is tried at every 50 ms across it and one step past it (at most ``MAX_POINTS``
moments, spread evenly when the window is longer). The real ``autopipe run`` launcher is
killed at a few moments of a real run in tests/runtime/run/test_save_kill.py.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from autopipe.runtime import commit
from autopipe.runtime.checkpoint import load_file, verify_folder
from autopipe.runtime.commit import leftovers
from autopipe.runtime.run import launch
from autopipe.runtime.run.options import RunOptions

FLOATS = 8_000_000  # per rank: 32 MB of stage file, a save window of a few hundred ms
STEP_S = 0.05
MAX_POINTS = 16
VICTIMS = ("rank 0", "rank 1", "launcher SIGTERM", "launcher SIGKILL")
_GRACE_S = 0.5  # launch._GRACE_S: how long the launcher waits for the others after a failure


def _rank(rank: int, port: int, ck: Path, step: int) -> None:
    """A forked rank: join the group, save its part of step ``step``'s checkpoint, exit."""
    os.setsid()
    code = 1
    try:
        import torch.distributed as dist

        from autopipe.runtime.comm import DistComm

        url = f"tcp://127.0.0.1:{port}"
        dist.init_process_group("gloo", init_method=url, rank=rank, world_size=2, timeout=timedelta(seconds=30))
        param = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([param], lr=0.1)
        states = {rank: {"w": torch.full((FLOATS,), float(step))}}
        meta = {"fingerprint": "sweep", "step": step, "stages": 2, "optimizer": {"name": "SGD", "lr": 0.1, "args": {}}}
        commit.save(ck, rank, DistComm(30), states, optimizer, meta)
        code = 0
    finally:
        os._exit(code)


def _start(ck: Path, step: int) -> list[int]:
    port = launch.free_port()
    pids = []
    for rank in range(2):
        pid = os.fork()
        if pid == 0:
            _rank(rank, port, ck, step)
        pids.append(pid)
    return pids


def _reap(pid: int, within: float) -> bool:
    """Wait up to ``within`` seconds for the forked ``pid`` to exit; whether it did."""
    deadline = time.monotonic() + within
    while True:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _kill_groups(pids: list[int], waited: set[int]) -> None:
    for pid in pids:
        if pid not in waited:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            assert _reap(pid, 30)
            waited.add(pid)


def _reaper(ck: Path, pids: list[int]) -> subprocess.Popen[bytes]:
    folders = launch._checkpoint_leftovers(RunOptions(save_checkpoint=str(ck)))
    reaper = subprocess.Popen([sys.executable, "-I", str(launch._REAPER), *folders], stdin=subprocess.PIPE)
    assert reaper.stdin is not None
    reaper.stdin.write("".join(f"{p}\n" for p in pids).encode())
    reaper.stdin.flush()
    return reaper


def _wait_for_save(ck: Path, pids: list[int]) -> float:
    """Until the save's new folder appears beside ``ck``; its moment."""
    deadline = time.monotonic() + 60
    while not leftovers(ck):
        assert time.monotonic() < deadline, "the save never began"
        time.sleep(0.001)
    return time.monotonic()


def _trial(ck: Path, step: int, victim: str | None, delay: float) -> tuple[bool, float]:
    """Save step ``step`` into ``ck``, kill ``victim`` ``delay`` s after the save began and clean
    up as the launcher would; (whether the save was still under way at the kill, its window)."""
    pids = _start(ck, step)
    reaper = _reaper(ck, pids) if victim == "launcher SIGKILL" else None
    waited: set[int] = set()
    try:
        began = _wait_for_save(ck, pids)
        time.sleep(max(0.0, began + delay - time.monotonic()))
        during = bool(leftovers(ck))
        if victim in ("rank 0", "rank 1"):
            target = pids[int(victim[-1])]
            os.kill(target, signal.SIGKILL)
            assert _reap(target, 30)
            waited.add(target)
            other = pids[1 - int(victim[-1])]
            if _reap(other, _GRACE_S):
                waited.add(other)
        elif victim is not None:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        if victim is None:
            waited.update(p for p in pids if _reap(p, 60))
        window = time.monotonic() - began
    finally:
        _kill_groups(pids, waited)
    if reaper is not None:
        assert reaper.stdin is not None
        reaper.stdin.close()  # the launcher is gone: its pipe closes
        assert reaper.wait(30) == 0
    else:
        launch._clean(RunOptions(save_checkpoint=str(ck)))
    return during, window


def _check(ck: Path, steps: tuple[int, ...], what: str) -> int:
    """The folder is one whole checkpoint of one of ``steps``, nothing beside it; its step."""
    meta = verify_folder(ck)  # every listed file, of its size and SHA-256, and nothing else
    assert meta["step"] in steps, what
    for j in range(2):  # the numbers are that step's too: no stage file of another save
        w = load_file(ck / f"stage-{j}.pt", meta["files"][f"stage-{j}.pt"])["w"]
        assert w.numel() == FLOATS and bool((w == meta["step"]).all()), what
    assert leftovers(ck) == [] and sorted(os.listdir(ck.parent)) == ["ck"], what
    return int(meta["step"])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2, /proc, fork")
def test_a_save_killed_every_50ms_leaves_the_old_or_the_new_checkpoint(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the forked ranks copy tensors inline, no thread pool after fork
    try:
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))])  # imports torch._dynamo (seconds) once, here
        ck = tmp_path / "ck"
        _trial(ck, 1, None, 0.0)
        _, window = _trial(ck, 2, None, 0.0)  # a save into a folder holding one: the full window
        step = _check(ck, (2,), "an unkilled save")
        points = min(MAX_POINTS, math.ceil(window / STEP_S) + 2)
        spacing = max(STEP_S, (window + STEP_S) / (points - 1))
        moments = [i * spacing for i in range(points)]
        kept, during = {0: 0, 1: 0}, 0
        for delay in moments:
            for victim in VICTIMS:
                what = f"{victim} killed {delay * 1000:.0f} ms into the save (window {window * 1000:.0f} ms)"
                was, _ = _trial(ck, step + 1, victim, delay)
                now = _check(ck, (step, step + 1), what)
                kept[now - step] += 1
                during += was
                step = now
    finally:
        torch.set_num_threads(before)
    print(f"{len(moments)} moments {spacing * 1000:.0f} ms apart x {len(VICTIMS)} victims; window {window:.2f}s")
    assert kept[0] and kept[1], kept  # kills fell before the commit point and after it
    assert during >= len(VICTIMS) * 2, during  # and most of them inside the save
