"""What cleans up after a launcher that was killed outright (SIGKILL, the OOM killer).

``autopipe run``'s launcher (:func:`autopipe.runtime.run.launch.launch`) starts this file as a
process of its own session (so a Ctrl-C at the terminal does not reach it), with the run's
temporary folders as arguments, and writes it each rank's process group as the rank starts. The
launcher's own cleanup kills the groups and removes the folders, then writes ``done``: this process
exits doing nothing. When its standard input closes without ``done`` -- the launcher died before its
cleanup could run -- it kills every rank's process group (the ranks die with their launcher anyway;
this takes what they started too) and removes the folders, so nothing of the run survives it.
An argument ``after-pid:PREFIX`` stands for the folders ``PREFIX<pid>-*`` of each rank's pid (the
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
        if folder.startswith("after-pid:"):  # a glob prefix, escaped by the launcher
            for group in groups:
                for found in glob.glob(f"{folder[len('after-pid:') :]}{group}-*"):
                    shutil.rmtree(found, ignore_errors=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
