"""What cleans up after a launcher that was killed outright (SIGKILL, the OOM killer).

``autopipe run``'s launcher (:func:`autopipe.runtime.run.launch.launch`) starts this file as a
process of its own session (so a Ctrl-C at the terminal does not reach it), with the run's
temporary folders as arguments, and writes it each rank's process group as the rank starts. The
launcher's own cleanup kills the groups and removes the folders, then writes ``done``: this process
exits doing nothing. When its standard input closes without ``done`` -- the launcher died before its
cleanup could run -- it kills every rank's process group (the ranks die with their launcher anyway;
this takes what they started too) and removes the folders, so nothing of the run survives it.
An argument ``run:ID`` names the run: every process whose environment holds
``AUTOPIPE_RUN_ID=ID`` (what each rank and everything it starts inherit) is killed too, found in
``/proc`` (Linux), so a process that left its rank's process group (``setsid``, a daemon) and was
adopted by init goes as well (:func:`sweep`, which the launcher's own cleanup calls). An argument
``after-pid:PREFIX`` stands for the folders ``PREFIX<pid>-*`` of each rank's pid (the
unfinished new folders a ``--save-checkpoint`` of that rank left, :mod:`autopipe.runtime.commit`).

Run as a file (``python -I reaper.py``), not a module: it imports nothing but the standard library.

Tests: tests/runtime/run/test_launch.py.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import sys

RUN_ENV = "AUTOPIPE_RUN_ID"  # set by the launcher for its ranks, inherited by what they start


def sweep(run_id: str, rounds: int = 5) -> None:
    """SIGKILL every process of this user whose environment holds ``AUTOPIPE_RUN_ID=run_id``,
    again until none is found (one may start another while it is being killed); nothing where
    there is no ``/proc``."""
    marker = f"{RUN_ENV}={run_id}".encode()
    for _ in range(rounds):
        found = False
        try:
            entries = [e for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid()]
        except OSError:
            return
        for entry in entries:
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":  # exited, not yet reaped
                        continue
                os.kill(int(entry), signal.SIGKILL)
                found = True
            except (OSError, IndexError):  # gone meanwhile, or another user's
                continue
        if not found:
            return


def main(folders: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    groups: list[int] = []
    for line in sys.stdin:  # one process group per line, then "done"; EOF alone: the launcher died
        word = line.strip()
        if word == "done":
            return 0
        if word.isdigit():
            groups.append(int(word))
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:  # gone already
            pass
    for folder in folders:
        if folder.startswith("run:"):
            sweep(folder[len("run:") :])
    for folder in folders:
        if folder.startswith("run:"):
            continue
        if folder.startswith("after-pid:"):  # a glob prefix, escaped by the launcher
            for group in groups:
                for found in glob.glob(f"{folder[len('after-pid:') :]}{group}-*"):
                    shutil.rmtree(found, ignore_errors=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
