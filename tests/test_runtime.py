"""Tests for the pipeline executor: transparency, faults, checkpoints, reports.

Transparency (torchgpipe's test): training with the pipeline equals single-process training
of the unsplit model — loss and every parameter after 3 optimizer steps within 1e-5 — for
every schedule, a model with long skips, one with tied weights and a Hugging Face GPT-2
traced by torch.export, on 2 and 4 real gloo processes (``GLOO_JOBS``: one launch per rank
count trains all its plans, tests/_gloo_jobs.py). The same cases also run with the ranks as
threads (same engine, in-memory transport that matches messages in posting order, as NCCL
does); the CLI and fault tests start processes through the launcher.
"""

from __future__ import annotations

import dataclasses
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

from autopipe.errors import CommunicationError, RuntimeFailure
from autopipe.plans import Plan
from autopipe.runtime import Rebuilt, RunOptions, assemble_state_dict, rebuild, run_threads
from autopipe.runtime.comm import ThreadHub
from autopipe.runtime.engine import ActionRecord
from autopipe.runtime.launch import free_port, launch
from autopipe.runtime.meters import ActionTimer
from autopipe.runtime.microbatch import split_batch, split_flat
from autopipe.runtime.records import RunResult
from autopipe.runtime.report import chrome_trace, compare, format_report
from autopipe.runtime.routing import BACKWARD, FORWARD, make_routing
from autopipe.stages.split import split_model
from tests.helpers import even_plan, max_diff, reference_training

torch.set_num_threads(1)

GPT = ("models/gpt.py", {"n_layer": 2, "n_embd": 32, "vocab_size": 64, "block_size": 16})
SKIP = ("tests/fixtures/skip_mlp.py", {})
HF = ("tests/fixtures/hf_gpt2.py", {})
GPT4 = ("models/gpt.py", {**GPT[1], "n_layer": 4})  # 8 blocks: interleaved on 4 ranks
HF4 = ("tests/fixtures/hf_gpt2.py", {"n_layer": 4})
MODELS = {"gpt": GPT, "skip": SKIP, "hf": HF, "gpt4": GPT4, "hf4": HF4}
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)]
FAULTY = "tests/fixtures/faulty.py"
STEPS, LR, TOL = 3, 0.1, 1e-5


@functools.cache
def _reference(model: str, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor]]:
    file, kwargs = MODELS[model]
    return reference_training(file, kwargs, steps=steps, batch_size=8, lr=LR)


@functools.cache
def _plan(
    model: str, stages: int, schedule: str, virtual: int = 1, recompute: tuple[int, ...] = ()
) -> Plan:
    file, kwargs = MODELS[model]
    return even_plan(
        file, kwargs, stages=stages, schedule=schedule, virtual=virtual, micro_batches=4,
        recompute=recompute,
    )


def _run(
    plan: Plan, tmp: Path, steps: int = STEPS, **kw: object
) -> tuple[RunResult, dict[str, torch.Tensor]]:
    folder = tmp / "ckpt"
    opts = RunOptions(
        steps=steps, optimizer="SGD", lr=LR, timeout_s=30, save_checkpoint=str(folder), **kw
    )  # type: ignore[arg-type]
    result = RunResult(tuple(run_threads(plan, opts, _rebuilt_for(plan))))
    return result, assemble_state_dict(folder)


_REBUILT: dict[tuple[str, int], Rebuilt] = {}


def _rebuilt_for(plan: Plan) -> Rebuilt:
    """Trace each model once for all its plans (the plans differ only in their cuts)."""
    key = (plan.recipe.model_file, plan.micro_batch_size)
    if key not in _REBUILT:
        _REBUILT[key] = rebuild(plan)
    return _REBUILT[key]


CASES = [
    # model, ranks, schedule, virtual, recomputed stages
    ("skip", 2, "gpipe", 1, ()),
    ("skip", 2, "1f1b", 1, ()),
    ("skip", 2, "interleaved-1f1b", 2, ()),
    ("skip", 2, "zb-h1", 1, ()),
    ("skip", 4, "gpipe", 1, ()),
    ("skip", 4, "1f1b", 1, (1, 2)),
    ("skip", 4, "interleaved-1f1b", 2, ()),
    ("skip", 4, "zb-h1", 1, (0, 3)),
    ("gpt", 2, "gpipe", 1, ()),
    ("gpt", 2, "1f1b", 1, ()),
    ("gpt", 2, "interleaved-1f1b", 2, ()),
    ("gpt", 2, "zb-h1", 1, ()),
    ("gpt", 2, "1f1b", 1, (0, 1)),
    ("gpt", 2, "zb-h1", 1, (1,)),
    ("gpt", 4, "1f1b", 1, ()),
    ("hf", 2, "gpipe", 1, ()),
    ("hf", 2, "1f1b", 1, (1,)),
    ("hf", 2, "interleaved-1f1b", 2, ()),
    ("hf", 2, "zb-h1", 1, ()),
]
HF_SLOW = [pytest.param(*case, marks=pytest.mark.slow) if case[0].startswith("hf") else case for case in CASES]


def _needs(model: str) -> None:
    """Skip a Hugging Face case where transformers is not installed."""
    if model.startswith("hf"):
        pytest.importorskip("transformers")


@pytest.mark.parametrize(("model", "ranks", "schedule", "virtual", "recompute"), HF_SLOW)
def test_pipeline_training_equals_unsplit_training(
    model: str, ranks: int, schedule: str, virtual: int, recompute: tuple[int, ...], tmp_path: Path
) -> None:
    _needs(model)
    plan = _plan(model, ranks, schedule, virtual, recompute)
    ref_losses, ref_state = _reference(model)
    result, state = _run(plan, tmp_path)
    assert len(result.losses) == STEPS
    assert max(abs(a - b) for a, b in zip(result.losses, ref_losses, strict=True)) <= TOL
    assert set(state) == set(ref_state)  # the whole state_dict, original names (tied ones too)
    assert max_diff(state, ref_state) <= TOL
    assert max_diff(state, _reference(model, 0)[1]) > 1e-3  # training moved the weights


def test_thread_ranks_get_the_batches_processes_draw(tmp_path: Path) -> None:
    """A recomputed stage sets and restores the global RNG in its backward, while other
    thread-ranks would be drawing their next batch from it: run_threads draws them first.
    A slow ``example_inputs`` (a data loader) makes the race it closes all but certain."""
    plan = _plan("skip", 4, "1f1b", 1, (1, 2))
    base = _rebuilt_for(plan)
    draw = base.loaded.make_inputs

    def slow(batch_size: int) -> object:
        time.sleep(0.002)
        return draw(batch_size)

    slow_base = Rebuilt(dataclasses.replace(base.loaded, make_inputs=slow), base.traced)
    opts = RunOptions(steps=STEPS, optimizer="SGD", lr=LR, timeout_s=30, save_checkpoint=str(tmp_path))
    result = RunResult(tuple(run_threads(plan, opts, slow_base)))
    ref_losses, ref_state = _reference("skip")
    assert max(abs(a - b) for a, b in zip(result.losses, ref_losses, strict=True)) <= TOL
    assert max_diff(assemble_state_dict(tmp_path), ref_state) <= TOL


def test_adam_matches_unsplit_training(tmp_path: Path) -> None:
    plan = _plan("skip", 2, "1f1b")
    file, kwargs = SKIP
    ref_losses, ref_state = reference_training(
        file, kwargs, steps=STEPS, batch_size=8, lr=1e-2, optimizer="Adam"
    )
    opts = RunOptions(steps=STEPS, optimizer="Adam", lr=1e-2, save_checkpoint=str(tmp_path))
    result = RunResult(tuple(run_threads(plan, opts)))
    assert max(abs(a - b) for a, b in zip(result.losses, ref_losses, strict=True)) <= TOL
    assert max_diff(assemble_state_dict(tmp_path), ref_state) <= 1e-4


def test_planned_state_bytes_are_what_each_rank_holds() -> None:
    """Weights, gradients and SGD's momentum per stage as planned (state_factor 3), the tied
    embedding's copy on the LM head's stage included, are exactly what the ranks hold."""
    from autopipe.costs.analytic import analytic_profile
    from autopipe.costs.devices import device_spec
    from autopipe.model.load import load_model
    from autopipe.solve.search import PlanRequest, plan_pipeline

    file, kwargs = GPT
    profile = analytic_profile(load_model(file, kwargs, device="meta"), device_spec("h100"), micro_batch_sizes=(2,))
    assert profile.blocks[-1].shared_param_bytes > 0  # lm_head uses wte.weight
    request = PlanRequest(
        devices=2, batch_size=8, memory_limit=2.0**30, micro_batches=4, schedule="1f1b", state_factor=3.0
    )
    plan = plan_pipeline(profile, request)
    options = RunOptions(steps=1, optimizer="SGD", lr=1e-3, optimizer_kwargs=(("momentum", 0.9),))
    for r in run_threads(plan, options):
        assert r.static_bytes == sum(s.static_bytes for s in plan.stages if s.rank == r.rank)


def test_resume_continues_bit_for_bit(tmp_path: Path) -> None:
    plan = _plan("gpt", 2, "zb-h1")
    base = dict(optimizer="Adam", lr=1e-2, timeout_s=30)
    run_threads(plan, RunOptions(steps=4, save_checkpoint=str(tmp_path / "full"), **base))  # type: ignore[arg-type]
    run_threads(plan, RunOptions(steps=2, save_checkpoint=str(tmp_path / "half"), **base))  # type: ignore[arg-type]
    resumed = RunOptions(
        steps=2, resume=str(tmp_path / "half"), save_checkpoint=str(tmp_path / "end"), **base
    )  # type: ignore[arg-type]
    results = run_threads(plan, resumed)
    assert results[0].steps_done == 4
    full, end = assemble_state_dict(tmp_path / "full"), assemble_state_dict(tmp_path / "end")
    assert set(full) == set(end)
    assert all(torch.equal(full[k], end[k]) for k in full)


# ----------------------------------------------------------------------------- pieces


def test_routing_gives_every_message_its_own_tag() -> None:
    plan = _plan("skip", 2, "interleaved-1f1b", 2)
    split = split_model(rebuild(plan).traced, plan)
    routing = make_routing(split, 2, plan.micro_batches)
    tags = [
        routing.tag(p, v, r, i, d, s)
        for (p, v, r) in routing.edges
        for i in range(plan.micro_batches)
        for d in (FORWARD, BACKWARD)
        for s in (0, 1)
    ]
    assert len(tags) == len(set(tags))
    # the first encoder output skips straight to the decoder stage that reads it
    down0 = split.stages[0].outputs
    assert any(r >= 2 for (p, v, r) in routing.edges if p == 0 and v in down0)


def test_micro_batches_cut_the_batch_dimension_only() -> None:
    x, mask = torch.arange(8.0).reshape(8, 1), torch.ones(3)
    mbs = split_flat([x, mask, 5], 8, 4)
    assert [mb[0].flatten().tolist() for mb in mbs] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(mb[1] is mask and mb[2] == 5 for mb in mbs)
    assert [t[0].tolist() for t in split_batch((torch.arange(4),), 4, 2)] == [[0, 1], [2, 3]]


def test_report_and_chrome_trace(tmp_path: Path) -> None:
    plan = _plan("skip", 2, "zb-h1")
    result = RunResult(tuple(run_threads(plan, RunOptions(steps=2))))
    rows = {r.what: r for r in compare(plan, result)}
    assert {
        "stage 0 F",
        "stage 1 B",
        "stage 1 W",
        "iteration",
        "bubble",
        "peak memory rank 1",
    } <= set(rows)
    assert all(r.measured > 0 for r in rows.values() if r.what != "bubble")
    assert rows["iteration"].error_pct == pytest.approx(
        (rows["iteration"].measured / plan.iteration_time_s - 1) * 100
    )
    assert "predicted" in format_report(plan, result)
    every = [e for e in chrome_trace(result)["traceEvents"] if e["ph"] == "X"]
    events = [e for e in every if e["cat"] != "wait"]
    assert len(events) == 2 * 3 * 4 * 2  # steps x (F, B, W) x micro-batches x stages
    assert {e["tid"] for e in events} == {0, 1}
    starts = {(e["tid"], e["name"], e["args"]["step"]): e["ts"] for e in events}
    for w in (e for e in every if e["cat"] == "wait"):  # a wait ends where its action starts
        key = (w["tid"], w["name"].removeprefix("wait "), w["args"]["step"])
        assert w["ts"] + w["dur"] == pytest.approx(starts[key])
    assert RunResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_action_times_split_waiting_from_work() -> None:
    timer = ActionTimer(torch.device("cpu"))
    timer.reset()
    with timer.time("1F0"):
        time.sleep(0.02)  # the message is on its way
        timer.ready()
        time.sleep(0.01)  # the stage computes
    with timer.time("0F1"):  # needed no message
        time.sleep(0.01)
    (_, s0, r0, e0), (_, s1, r1, e1) = timer.results()
    assert r0 - s0 >= 0.02 and e0 - r0 >= 0.01  # sleeps last at least that long
    assert r1 == s1 and e1 - r1 >= 0.01
    rec = ActionRecord("1F0", s0, r0, e0)
    assert rec.wait_s + rec.compute_s == pytest.approx(e0 - s0)


def test_thread_rank_error_is_raised() -> None:
    plan = even_plan(FAULTY, stages=2, micro_batches=4, leaf_modules=("Bomb",))
    with pytest.raises(RuntimeFailure, match="unknown optimizer"):
        run_threads(plan, RunOptions(optimizer="NoSuchOpt"))


# ----------------------------------------------------------------------------- processes (gloo)


@pytest.mark.slow
def test_cli_run_with_gloo_equals_unsplit_training_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan("gpt", 2, "1f1b", 1, (1,))
    plan.save(tmp_path / "plan.json")
    common = [str(tmp_path / "plan.json"), "--optimizer", "SGD", "--lr", str(LR), "--timeout", "30"]
    code = main(
        [
            "run",
            *common,
            "--steps",
            "3",
            "--save-checkpoint",
            str(tmp_path / "c3"),
            "--trace",
            str(tmp_path / "t.json"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "stage 1 B" in out and "bubble" in out and "loss per step" in out
    assert max_diff(assemble_state_dict(tmp_path / "c3"), _reference("gpt")[1]) <= TOL
    assert {e.get("tid") for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]} >= {
        0,
        1,
    }
    code = main(
        [
            "run",
            *common,
            "--steps",
            "1",
            "--resume",
            str(tmp_path / "c3"),
            "--save-checkpoint",
            str(tmp_path / "c4"),
            "--json",
        ]
    )
    assert code == 0
    assert len(json.loads(capsys.readouterr().out)["losses"]) == 1
    run_threads(
        plan, RunOptions(steps=4, optimizer="SGD", lr=LR, save_checkpoint=str(tmp_path / "t4"))
    )
    threads, procs = assemble_state_dict(tmp_path / "t4"), assemble_state_dict(tmp_path / "c4")
    assert all(torch.equal(threads[k], procs[k]) for k in threads)


# Every schedule x every model on real gloo processes. One launch per rank count trains all
# its plans in sequence (tests/_gloo_jobs.py): process start-up is paid twice, not per case.
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
            _plan(job[0], ranks, job[2], job[3], job[4]).save(path)
            jobs.append({"name": _job_name(job), "plan": str(path)})
    (root / "jobs.json").write_text(json.dumps(jobs))
    port, procs, logs = free_port(), [], []
    for rank in range(ranks):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}  # fmt: skip
        logs.append(root / f"log-{rank}.txt")
        with open(logs[-1], "wb") as log:
            cmd = [sys.executable, "-m", "tests._gloo_jobs", str(root / "jobs.json"), str(root)]
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
    _needs(model)
    out = _gloo_launch(ranks, _shared_dir(tmp_path_factory, ranks))
    losses = {}
    for r in range(ranks):
        losses.update(
            {k: v for k, v in json.loads((out / f"losses-{r}.json").read_text()).items() if v}
        )
    ref_losses, ref_state = _reference(model)
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


def test_thread_comm_matches_receives_by_position_as_nccl_does() -> None:
    hub = ThreadHub(2, timeout_s=5)
    a, b = hub.comm(0), hub.comm(1)
    a.isend(torch.ones(1), 1, tag=7)
    a.isend(torch.zeros(1), 1, tag=8)
    out = torch.empty(1)
    with pytest.raises(CommunicationError, match="expected tag 8, the send has tag 7"):
        b.irecv(out, 0, tag=8).wait()  # posted first: it meets the first send, not tag 8
    b.irecv(out, 0, tag=8).wait()
    assert out.item() == 0.0


def test_a_relative_model_file_is_found_beside_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from autopipe.errors import ModelLoadError
    from autopipe.runtime.worker import rebuild

    shutil.copy(Path(__file__).parent.parent / "models" / "mlp.py", tmp_path / "mlp.py")
    monkeypatch.chdir(tmp_path)
    plan = even_plan("mlp.py", {"depth": 2}, stages=2, micro_batches=4)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ModelLoadError, match="model file not found"):
        rebuild(plan)
    assert rebuild(plan, base=str(tmp_path)).traced.fingerprint() == plan.recipe.fingerprint
