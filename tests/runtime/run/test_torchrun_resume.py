"""``--resume`` under torchrun (``python -m autopipe.runtime`` with torchrun's environment, no
``autopipe run`` launcher to check the folder first): a folder with a changed, missing, extra or
symbolically linked file is refused by every rank in one line, exit 2, before any step, and the
folder is left as it was; an untouched one resumes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from autopipe.runtime import RunOptions, run_threads
from autopipe.runtime.checkpoint import read_meta
from autopipe.runtime.run.launch import free_port
from autopipe.runtime.run.options import LAUNCHER_ENV
from tests.runtime.helpers import cached_plan, rebuilt_for

ROOT = Path(__file__).resolve().parents[3]  # where the plan's model path is relative to
_AGAIN = "save the checkpoint again with --save-checkpoint"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A plan file and a real checkpoint of it (one step)."""
    root = tmp_path_factory.mktemp("torchrun")
    plan = cached_plan("skip", 2, "1f1b")
    plan.save(root / "plan.json")
    opts = RunOptions(steps=1, lr=0.1, timeout_s=30, save_checkpoint=str(root / "ck"))
    run_threads(plan, opts, rebuilt_for(plan))
    return root / "plan.json", root / "ck"


def _torchrun(plan: Path, ck: Path) -> list[subprocess.CompletedProcess[str]]:
    """Both ranks of ``--resume ck``, started as torchrun starts them."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != LAUNCHER_ENV}
    argv = [sys.executable, "-m", "autopipe.runtime", str(plan), "--steps", "1", "--resume", str(ck)]
    argv += ["--device", "cpu", "--threads", "1", "--timeout", "30"]
    procs = []
    for rank in range(2):
        world = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
        world |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(
            subprocess.Popen(argv, cwd=ROOT, env=env | world, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    done = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        finally:
            p.kill()
        done.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
    return done


def _change(ck: Path) -> str:
    path = ck / "stage-1.pt"  # rank 1's file only: rank 0 learns of it from rank 1
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only its SHA-256 tells
    path.write_bytes(bytes(data))
    said = "does not match its SHA-256 in meta.json (changed since the save, or of another save)"
    return f"--resume: {path} {said}; {_AGAIN}"


def _remove(ck: Path) -> str:
    (ck / "rank-1.pt").unlink()
    return f"--resume: checkpoint {ck} has no rank-1.pt, which its meta.json lists (a partial save); {_AGAIN}"


def _add(ck: Path) -> str:
    shutil.copy(ck / "stage-0.pt", ck / "stage-7.pt")
    return (
        f"--resume: {ck / 'stage-7.pt'} is not in the checkpoint's meta.json (a file of another save, or added "
        f"since): the folder is not one checkpoint; {_AGAIN}"
    )


def _link(ck: Path) -> str:
    aside = ck.parent / "stage-0-aside.pt"
    (ck / "stage-0.pt").rename(aside)
    (ck / "stage-0.pt").symlink_to(aside)  # the same bytes, through a link
    return f"--resume: {ck / 'stage-0.pt'} is a symbolic link, not a checkpoint file (not followed); {_AGAIN}"


def _listing(ck: Path) -> dict[str, bytes]:
    return {n: (ck / n).read_bytes() if not (ck / n).is_symlink() else b"link" for n in sorted(os.listdir(ck))}


@pytest.mark.slow
@pytest.mark.parametrize("tamper", [_change, _remove, _add, _link], ids=["changed", "missing", "extra", "symlink"])
def test_torchrun_refuses_a_tampered_checkpoint_in_one_line(
    tamper: Callable[[Path], str], saved: tuple[Path, Path], tmp_path: Path
) -> None:
    plan, original = saved
    ck = tmp_path / "ck"
    shutil.copytree(original, ck)
    said = tamper(ck)
    before = _listing(ck)
    for rank, done in enumerate(_torchrun(plan, ck)):
        lines = done.stderr.strip().splitlines()
        assert (done.returncode, lines) == (2, [f"autopipe: error: {said}"]), (rank, done.stderr)
        assert done.stdout == ""
    assert _listing(ck) == before  # nothing written, nothing removed
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".ck")) == []


@pytest.mark.slow
def test_torchrun_resumes_an_untouched_checkpoint(saved: tuple[Path, Path], tmp_path: Path) -> None:
    plan, original = saved
    ck = tmp_path / "ck"
    shutil.copytree(original, ck)
    ranks = _torchrun(plan, ck)
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr for r in ranks]
    assert read_meta(ck)["step"] == 1  # resumed from it, not written: no --save-checkpoint
