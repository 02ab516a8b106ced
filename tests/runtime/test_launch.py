"""Real gloo processes: every schedule and model equals unsplit training (gloo_worker.py), failing
and hung ranks end the run."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

from autopipe.errors import RuntimeFailure
from autopipe.runtime import RunOptions, assemble_state_dict
from autopipe.runtime.launch import free_port, launch
from tests.helpers import even_plan, max_diff
from tests.runtime.helpers import (
    FAULTY,
    TOL,
    cached_plan,
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
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}  # fmt: skip
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
    model, ranks = job[0], job[1]
    skip_without_transformers(model)
    out = _gloo_launch(ranks, _shared_dir(tmp_path_factory, ranks))
    losses = {}
    for r in range(ranks):
        losses.update(
            {k: v for k, v in json.loads((out / f"losses-{r}.json").read_text()).items() if v}
        )
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
@pytest.mark.parametrize(("fault", "message"), [("raise:1", "rank 1 failed: RuntimeError: boom (tests/fixtures/faulty.py:"),
                                                ("kill:1", "rank 1 failed: killed by SIGKILL")])  # fmt: skip
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
    start = time.monotonic()
    code = main(["run", str(tmp_path / "plan.json"), "--steps", "3", "--timeout", "3"])
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith(f"autopipe: error: {message}")
    assert elapsed < 40  # process start-up (importing torch) plus far less than a hang


@pytest.mark.slow
def test_a_hung_rank_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = even_plan(FAULTY, stages=2, micro_batches=4, leaf_modules=("Bomb",))
    monkeypatch.setenv("AUTOPIPE_TEST_FAULT", "hang:1")
    with pytest.raises(
        RuntimeFailure,
        match=r"rank 1 failed: it stopped responding \(rank 0 gave up on it: receiving from rank 1 .*(Timed out|timed out)",
    ) as info:
        launch(plan, RunOptions(steps=1, timeout_s=2))
    assert info.value.rank == 1
