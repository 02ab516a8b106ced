"""Real gloo processes: every schedule and model equals unsplit training (gloo_worker.py), failing
and hung ranks end the run, killing the launcher kills its ranks."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

from autopipe.errors import RunOptionError, RuntimeFailure
from autopipe.runtime import RunOptions, assemble_state_dict
from autopipe.runtime.run.launch import _kill, _watch, free_port, launch
from autopipe.runtime.run.options import LAUNCHER_ENV
from tests.helpers import even_plan, max_diff
from tests.runtime.helpers import (
    FAULTY,
    TOL,
    cached_plan,
    fake_checkpoint,
    skip_without_transformers,
    unsplit_reference,
)

torch.set_num_threads(1)


SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)]


# Every schedule x every model on real gloo processes. One launch per rank count trains all
# its plans in sequence (tests/runtime/gloo_worker.py): process start-up is paid twice, not per case.
GLOO_JOBS = [
    # model, ranks, schedule, virtual, recomputed stages
    *[(m, 2, s, v, ()) for m in ("skip", "gpt", "hf") for s, v in SCHEDULES],
    ("skip", 2, "1f1b", 1, (0, 1)),
    ("gpt", 2, "zb-h1", 1, (1,)),
    ("hf", 2, "interleaved-1f1b", 2, (1, 2)),
    ("skip", 4, "gpipe", 1, (1,)),
    ("skip", 4, "1f1b", 1, ()),
    ("skip", 4, "interleaved-1f1b", 2, (0, 5)),
    ("skip", 4, "zb-h1", 1, (2, 3)),
    ("gpt4", 4, "gpipe", 1, ()),
    ("gpt4", 4, "1f1b", 1, (0, 3)),
    ("gpt4", 4, "interleaved-1f1b", 2, ()),
    ("gpt4", 4, "zb-h1", 1, (1,)),
    ("hf4", 4, "gpipe", 1, (2,)),
    ("hf4", 4, "1f1b", 1, ()),
    ("hf4", 4, "interleaved-1f1b", 2, (3, 4)),
    ("hf4", 4, "zb-h1", 1, ()),
]


def _job_name(job: tuple[str, int, str, int, tuple[int, ...]]) -> str:
    model, ranks, schedule, _virtual, recompute = job
    return f"{model}-{ranks}-{schedule}-r{''.join(map(str, recompute))}"


@functools.cache
def _gloo_launch(ranks: int, root: Path) -> Path:
    """Run every GLOO_JOBS entry with ``ranks`` ranks in one launch; the output folder."""
    jobs = []
    hf = importlib.util.find_spec("transformers") is not None
    for job in GLOO_JOBS:
        if job[1] == ranks and (hf or not job[0].startswith("hf")):
            path = root / f"{_job_name(job)}.json"
            cached_plan(job[0], ranks, job[2], job[3], job[4]).save(path)
            jobs.append({"name": _job_name(job), "plan": str(path)})
    (root / "jobs.json").write_text(json.dumps(jobs))
    port, procs, logs = free_port(), [], []
    for rank in range(ranks):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(ranks),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        logs.append(root / f"log-{rank}.txt")
        with open(logs[-1], "wb") as log:
            cmd = [sys.executable, "-m", "tests.runtime.gloo_worker", str(root / "jobs.json"), str(root)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        tails = [f"rank {r}: " + logs[r].read_text()[-2000:] for r in range(ranks) if codes[r]]
        raise AssertionError("gloo job launch failed\n" + "\n".join(tails))
    return root


@pytest.mark.slow
@pytest.mark.parametrize("job", GLOO_JOBS, ids=_job_name)
def test_gloo_processes_equal_unsplit_training(
    job: tuple[str, int, str, int, tuple[int, ...]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The ranks join with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT alone, no secret: torch.distributed as it is.
    # docs/security.md: "Across machines, `torchrun ... -m autopipe.runtime` uses `torch.distributed` as it is"
    model, ranks = job[0], job[1]
    skip_without_transformers(model)
    out = _gloo_launch(ranks, _shared_dir(tmp_path_factory, ranks))
    losses = {}
    for r in range(ranks):
        losses.update({k: v for k, v in json.loads((out / f"losses-{r}.json").read_text()).items() if v})
    ref_losses, ref_state = unsplit_reference(model)
    name = _job_name(job)
    assert max(abs(a - b) for a, b in zip(losses[name], ref_losses, strict=True)) <= TOL
    state = assemble_state_dict(out / name)
    assert set(state) == set(ref_state)
    assert max_diff(state, ref_state) <= TOL


_SHARED: dict[int, Path] = {}


def _shared_dir(factory: pytest.TempPathFactory, ranks: int) -> Path:
    if ranks not in _SHARED:
        _SHARED[ranks] = factory.mktemp(f"gloo{ranks}")
    return _SHARED[ranks]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("raise:1", "rank 1 failed: RuntimeError: boom (tests/fixtures/faulty.py:"),
        ("kill:1", "rank 1 failed: killed by SIGKILL"),
    ],
)
def test_a_failing_rank_ends_the_run_naming_it(
    fault: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = even_plan(FAULTY, stages=2, micro_batches=4, leaf_modules=("Bomb",))
    plan.save(tmp_path / "plan.json")
    monkeypatch.setenv("AUTOPIPE_TEST_FAULT", fault)
    code = main(["run", str(tmp_path / "plan.json"), "--steps", "3", "--timeout", "3"])  # a hang: the test's timeout
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith(f"autopipe: error: {message}")


@pytest.mark.slow
def test_a_hung_rank_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = even_plan(FAULTY, stages=2, micro_batches=4, leaf_modules=("Bomb",))
    monkeypatch.setenv("AUTOPIPE_TEST_FAULT", "hang:1")
    with pytest.raises(
        RuntimeFailure,
        match=r"rank 1 failed: it stopped responding "
        r"\(rank 0 gave up on it: receiving from rank 1 .*(Timed out|timed out)",
    ) as info:
        launch(plan, RunOptions(steps=1, timeout_s=2))
    assert info.value.rank == 1


# ----------------------------------------------------------------------------- nothing hangs

SLOW = "tests/fixtures/slow_backward.py"


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _rank_pids(launcher: int) -> list[int]:
    """The launcher's children but its reaper (autopipe/runtime/run/reaper.py): the ranks."""
    out = []
    for pid in _children(launcher):
        try:
            if b"reaper.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited (reparented ones wait for a reaper)


def _ranks_up(launcher: int, world: int, within: float = 120) -> list[int]:
    """The launcher's rank pids, once ``world`` of them have imported torch."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        kids = _children(launcher)
        try:
            up = [k for k in kids if "libtorch" in Path(f"/proc/{k}/maps").read_text()]
        except OSError:
            up = []
        if len(up) == world:
            return up
        time.sleep(0.2)
    raise AssertionError(f"the ranks of {launcher} did not start within {within}s")


def _autopipe_run(argv: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autopipe.cli", "run", *argv, "--device", "cpu"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _slow_plan(tmp_path: Path) -> Path:
    even_plan(SLOW, stages=2, micro_batches=4, leaf_modules=("SlowBackward",)).save(tmp_path / "plan.json")
    return tmp_path / "plan.json"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_rank_hung_in_the_last_backward_ends_the_run(tmp_path: Path) -> None:
    plan, hung = _slow_plan(tmp_path), tmp_path / "hung"
    # rank 0 sleeps in its 8th backward: the last of step 2 (4 micro-batches per step); rank 1
    # has nothing left to receive from it and finishes
    proc = _autopipe_run(
        [str(plan), "--steps", "2", "--timeout", "10"],
        AUTOPIPE_TEST_SLOW_BACKWARD="0:8",
        AUTOPIPE_TEST_SLOW_BACKWARD_FILE=str(hung),
    )
    ranks: set[int] = set()
    saw_hang = False
    try:
        deadline = time.monotonic() + 240  # only a hang gets near it (15-20 s on an idle 2-core machine)
        while proc.poll() is None and time.monotonic() < deadline:
            ranks.update(_rank_pids(proc.pid))
            saw_hang = saw_hang or hung.exists()
            time.sleep(0.1)
        ended_by_itself = proc.poll() is not None
    finally:
        proc.kill()
    err = proc.communicate()[1].strip().splitlines()
    assert ended_by_itself, "autopipe run still running 240 s after it started: the hung rank was not noticed"
    assert proc.returncode == 1, err
    assert err[-1].startswith(
        "autopipe: error: rank 0 failed: it stopped responding (rank 1 gave up on it: "
    )  # rank 1 gives up in the step's loss broadcast or in the end-of-run barrier
    assert saw_hang and len(ranks) == 2
    assert not [r for r in ranks if _alive(r)]


def test_a_rank_that_exits_0_without_a_result_is_the_one_named(tmp_path: Path) -> None:
    """sys.exit(0) in a rank's model code: that rank is the culprit, not the peer left waiting for it."""
    procs = [subprocess.Popen(["sleep", "60"], start_new_session=True), subprocess.Popen(["sleep", "0"])]
    try:
        with pytest.raises(RuntimeFailure) as info:
            _watch(procs, tmp_path, late_s=30)
    finally:
        _kill(procs)
    assert info.value.rank == 1 and str(info.value) == (
        "rank 1 failed: it exited with code 0 before its last step, without a result (sys.exit(0) or "
        "os._exit(0) in the model's code?); its peers were stopped"
    )


def test_the_launcher_stops_waiting_for_a_rank_once_another_finished(tmp_path: Path) -> None:
    (tmp_path / "rank-0.json").write_text("{}")  # rank 0 finished: its result is there
    procs = [subprocess.Popen(["sleep", "0"]), subprocess.Popen(["sleep", "60"], start_new_session=True)]
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeFailure) as info:
            _watch(procs, tmp_path, late_s=0.5)
    finally:
        _kill(procs)
    assert str(info.value) == (
        "rank 1 failed: it stopped responding (rank 0 finished 0.5s before and rank 1 has not finished since)"
    )
    # it waited late_s, and not for the 60 s sleep (a lower bound: a busy machine only adds time)
    assert info.value.rank == 1 and 0.5 <= time.monotonic() - start < 30
    assert procs[1].returncode == -signal.SIGKILL


def _no_rank(*args: object, **kwargs: object) -> None:
    raise AssertionError("a rank was started")


def test_launch_checks_its_options_against_the_plan_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = cached_plan("skip", 2, "1f1b")
    fake_checkpoint(tmp_path / "ck", step=3, fingerprint="0123")
    monkeypatch.setattr(subprocess, "Popen", _no_rank)
    with pytest.raises(RunOptionError) as info:
        launch(plan, RunOptions(resume=str(tmp_path / "ck")))
    assert str(info.value) == (
        f"--resume {str(tmp_path / 'ck')!r}: the checkpoint was saved with another plan (model fingerprint 0123, "
        f"2 stages; this plan: {plan.recipe.fingerprint}, 2 stages); resume with the plan it was saved with"
    )
    with pytest.raises(RunOptionError, match=r"^--lr must be a finite number >= 0, like 1e-3 \(got nan\)$"):
        launch(plan, RunOptions(lr=float("nan")))


# ----------------------------------------------------------------------------- stopping


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_killing_the_launcher_kills_the_ranks(sig: signal.Signals, tmp_path: Path) -> None:
    """Nothing of the run survives its launcher: the ranks, the processes they started, the
    launcher's temporary folders (SIGKILL: removed by the reaper, autopipe/runtime/run/reaper.py)."""
    temp, spawned = tmp_path / "tmp", tmp_path / "spawned"
    temp.mkdir()
    spawned.mkdir()
    argv = [str(_slow_plan(tmp_path)), "--steps", "1000000", "--timeout", "60"]
    proc = _autopipe_run(argv, TMPDIR=str(temp), AUTOPIPE_TEST_SPAWN=str(spawned))
    ranks: list[int] = []
    children: list[int] = []
    try:
        ranks = _ranks_up(proc.pid, 2)
        deadline = time.monotonic() + 120
        while len(list(spawned.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        children = [int(f.read_text()) for f in spawned.iterdir()]
        assert all(_alive(p) for p in ranks + children) and len(children) == 2
        assert sorted(f.name.split("-")[1] for f in temp.iterdir()) == ["progress", "run"]
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == (143 if sig == signal.SIGTERM else -sig)  # SIGTERM: ranks killed, one line
        deadline = time.monotonic() + 60  # hang-only: a busy machine can take seconds to reap
        while (any(_alive(p) for p in ranks + children) or list(temp.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in ranks + children if _alive(p)]
        assert list(temp.iterdir()) == []
    finally:
        proc.kill()
        for p in ranks + children:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_finished_run_leaves_no_process_it_started(tmp_path: Path) -> None:
    spawned = tmp_path / "spawned"
    spawned.mkdir()
    proc = _autopipe_run([str(_slow_plan(tmp_path)), "--steps", "1"], AUTOPIPE_TEST_SPAWN=str(spawned))
    try:
        assert proc.wait(timeout=120) == 0, proc.communicate()[1]
    finally:
        proc.kill()
    children = [int(f.read_text()) for f in spawned.iterdir()]
    assert len(children) == 2
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in children if _alive(p)]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_kills_the_ranks_and_says_interrupted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _slow_plan(tmp_path)
    before = signal.getsignal(signal.SIGINT)
    ranks: list[int] = []

    def interrupt() -> None:
        ranks.extend(_ranks_up(os.getpid(), 2))
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt, daemon=True)
    timer.start()
    code = main(["run", str(plan), "--steps", "1000000", "--timeout", "60", "--device", "cpu"])
    timer.join(timeout=1)
    assert code == 130
    assert capsys.readouterr().err == "autopipe: interrupted\n"
    assert len(ranks) == 2 and not [r for r in ranks if _alive(r)]  # killed and reaped before main returned
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow
def test_a_launched_rank_exits_when_its_launcher_is_gone(tmp_path: Path) -> None:
    """The portable fallback (a closed stdin) and the check that the launcher is the parent."""
    plan = _slow_plan(tmp_path)
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "autopipe.runtime", str(plan), "--device", "cpu", "--timeout", "60"]
    # The parent is this process: the rank waits for its peer (60 s) until its stdin closes.
    rank = subprocess.Popen(
        cmd, env={**env, LAUNCHER_ENV: str(os.getpid())}, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    # Another pid as the launcher: its launcher is already gone, it exits at once.
    orphan = subprocess.Popen(cmd, env={**env, LAUNCHER_ENV: "1"}, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert orphan.wait(timeout=10) == 1
        time.sleep(1)
        assert rank.poll() is None
        assert rank.stdin is not None
        rank.stdin.close()
        assert rank.wait(timeout=10) == 1
    finally:
        for p in (rank, orphan):
            p.kill()
            p.wait()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_launched_rank_dies_with_its_parent_even_while_its_stdin_stays_open(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG alone: the rank's stdin is a pipe this test keeps open, its parent (a
    stand-in launcher) dies by SIGKILL; the rank must die too."""
    plan = _slow_plan(tmp_path)
    read_end, write_end = os.pipe()
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "autopipe.runtime", str(plan), "--device", "cpu", "--timeout", "60"]
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time; env = {**os.environ, sys.argv[1]: str(os.getpid())}; "
            "subprocess.Popen(sys.argv[2:], env=env, stdin=0, stderr=subprocess.DEVNULL); time.sleep(120)",
            LAUNCHER_ENV,
            *cmd,
        ],
        env=env,
        stdin=read_end,
    )
    os.close(read_end)
    rank: list[int] = []
    try:
        rank = _ranks_up(parent.pid, 1)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 60  # hang-only: the rank notices within a second or two
        while _alive(rank[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(rank[0])
    finally:
        os.close(write_end)
        parent.kill()
        for r in rank:
            if _alive(r):
                os.kill(r, signal.SIGKILL)


def test_a_data_parallel_plan_says_the_run_trains_one_replica(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import dataclasses
    import logging

    from autopipe.runtime.run import launch as launch_module

    class Started(Exception):
        pass

    def no_ranks() -> int:
        raise Started

    monkeypatch.setattr(launch_module, "free_port", no_ranks)  # stop where the ranks would start
    plan = dataclasses.replace(even_plan("mlp.py", stages=2), data_parallel=2)
    with caplog.at_level(logging.WARNING, logger="autopipe"), pytest.raises(Started):
        launch(plan, RunOptions())
    assert [r.getMessage() for r in caplog.records] == [
        f"the plan has 2 data-parallel replicas; this run trains one of them (2 ranks, batch {plan.batch_size}) "
        "and no gradient all-reduce between replicas (the whole layout: autopipe config PLAN --for megatron or "
        "--for torchtitan)"
    ]
