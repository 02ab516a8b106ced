"""No process or temporary folder of ``autopipe run`` outlives it, whether the run succeeded, a
rank raised, or the launcher was killed (SIGTERM, SIGKILL).

Each rank starts a child and a grandchild (tests/fixtures/spawner.py), and in the own-session
cases one more process that leaves the rank's process group (``setsid``), as a daemon does. The processes are found
by what every one of them inherits, a marker in the environment, scanning ``/proc`` (so an
orphan adopted by init is found too), and the test process's own children are listed as well;
the run's temporary folder is ``TMPDIR`` (``tempfile.gettempdir()`` of the launcher and of each
rank), a fresh one per run. Both are listed before and after; the cleanup (the launcher's, or
its reaper's when the launcher was killed) gets up to 10 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, even_plan

_SETTLE_S = 10.0


def _tagged(tag: str) -> dict[int, str]:
    """pid -> command line of every process whose environment holds ``tag``."""
    found = {}
    marker = f"AUTOPIPE_LEAK_TAG={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0") and _state(entry) != "Z":
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _state(entry: Path) -> str:
    return (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]


def _children() -> set[int]:
    """This process's children that still run (zombies have exited)."""
    out = set()
    for task in Path("/proc/self/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                if _state(Path(f"/proc/{child}")) != "Z":
                    out.add(int(child))
            except OSError:
                continue
    return out


def _settled(tag: str, tmp: Path, children: set[int]) -> tuple[dict[int, str], list[str], set[int]]:
    """What of the run is left once its cleanup has had up to 10 s."""
    deadline = time.monotonic() + _SETTLE_S
    while True:
        left = (_tagged(tag), sorted(os.listdir(tmp)), _children() - children)
        if not any(left) or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
# each rank starts a child and a grandchild in its group and one in a session of its own (setsid):
# the same-group-only variant is a subset of this one and doubled the test's time
@pytest.mark.parametrize("setsid", [True], ids=["own-session"])
@pytest.mark.parametrize("end", ["succeeds", "fails", "SIGTERM", "SIGKILL"])
def test_nothing_of_a_run_survives_it(end: str, setsid: bool, tmp_path: Path) -> None:
    plan = even_plan(str(FIXTURES / "spawner.py"), stages=2, micro_batches=2, leaf_modules=("Bomb",))
    plan.save(tmp_path / "plan.json")
    tag, tmp, hung = uuid.uuid4().hex, tmp_path / "tmp", tmp_path / "hung"
    tmp.mkdir()
    fault = {"fails": "raise:1", "SIGTERM": "hang:1", "SIGKILL": "hang:1"}.get(end, "")
    env = {**os.environ, "TMPDIR": str(tmp), "AUTOPIPE_LEAK_TAG": tag, "AUTOPIPE_TEST_FAULT": fault}
    env |= {"AUTOPIPE_TEST_FAULT_FILE": str(hung), "AUTOPIPE_TEST_SETSID": "1" if setsid else ""}
    before = (_tagged(tag), sorted(os.listdir(tmp)), _children())
    assert before[:2] == ({}, [])
    argv = [sys.executable, "-m", "autopipe.cli", "run", str(tmp_path / "plan.json"), "--steps", "2"]
    argv += ["--device", "cpu", "--timeout", "30"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if end in ("SIGTERM", "SIGKILL"):
            deadline = time.monotonic() + 120
            while not hung.exists():
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.05)
            assert len(_tagged(tag)) >= 2 + 2 * (4 + setsid)  # launcher, reaper, 2 x (rank, sh, sleep x 2)
            proc.send_signal(getattr(signal, end))
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        try:
            processes, files, children = _settled(tag, tmp, before[2])
        finally:
            for pid in _tagged(tag):  # what outlived the run: not past this test
                os.kill(pid, signal.SIGKILL)
    expected = {"succeeds": 0, "fails": 1, "SIGTERM": 143, "SIGKILL": -signal.SIGKILL}[end]  # 143: cleaned up, one line
    assert proc.returncode == expected, err
    if end == "fails":
        assert "rank 1 failed: RuntimeError: boom" in err
    if end == "SIGTERM":
        assert err.splitlines()[-1] == "autopipe: terminated" and "Traceback" not in err, err
    assert processes == {}, f"outlived the run ({end}): {processes}"
    assert files == [], f"left in TMPDIR ({end}): {files}"
    assert children == set()
