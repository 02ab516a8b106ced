"""One rank of the zero-bubble export test (tests/stages/test_zero_bubble_export.py, issue 27),
and the harness it and bench/bench_zero_bubble_torch.py share.

    python tests/stages/zb_worker.py RANK WORLD PORT OUT.pt PLAN.json [PLAN.json ...]

Trains each plan's model (tests/fixtures/hf_zoo.py, rebuilt seeded) ``STEPS`` SGD steps on gloo
through ``to_torch_pipelining`` in docs/outlets.md's loop. Saves per plan the per-step losses
(the mean over micro-batches, on the last rank), the parameters this rank's stages hold (by
the model's names) and the seconds it took, or the first line of the error construction or
training raised. :func:`check_cases` plans, runs and compares a matrix of (arch, schedule).
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autopipe.plans import Plan
from autopipe.runtime.pipeline import pipeline
from autopipe.stages.export import pipeline_inputs, sync_shared_grads, to_torch_pipelining
from autopipe.stages.rebuild import rebuild_model

STEPS = 3
LR = 0.1


def main() -> None:
    rank, world, port, out, plans = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    seconds = int(os.environ.get("ZB_TIMEOUT", "60"))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=seconds))
    results: dict[str, dict[str, object]] = {}
    for path in plans:
        start = time.perf_counter()
        try:
            results[path] = _train(Plan.load(path), rank, path.endswith("-engine.json"))
            results[path]["seconds"] = time.perf_counter() - start
        except Exception as e:  # the test reads the error
            if os.environ.get("ZB_TRACEBACK"):
                traceback.print_exc()
            results[path] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def _train(plan: Plan, rank: int, engine: bool) -> dict[str, object]:
    loaded = rebuild_model(plan)
    model = loaded.model
    x, y = loaded.make_inputs(plan.batch_size), loaded.make_targets(plan.batch_size)  # type: ignore[misc]
    example = loaded.make_inputs(plan.micro_batch_size)
    if engine:
        pipe = pipeline(plan, model, rank=rank, example_inputs=example, loss_fn=loaded.loss_fn, engine="torch")
        held = {id(p) for p in pipe.parameters()}
        opt = torch.optim.SGD(list(pipe.parameters()), lr=LR)
        got = []
        for _ in range(STEPS):
            got.append(pipe.step(x, y))  # the batch's mean loss, on every rank
            opt.step()
            opt.zero_grad()
        kept = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in held}
        return {"losses": got if rank == 1 else [], "params": kept}
    stages, schedule = to_torch_pipelining(plan, model, rank, example_inputs=example, loss_fn=loaded.loss_fn)
    params = list({id(p): p for s in stages for p in s.submod.parameters()}.values())
    optimizer = torch.optim.SGD(params, lr=LR)
    last = stages[-1].is_last
    step_losses: list[float] = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        schedule.step(*pipeline_inputs(stages, x), target=y if last else None, losses=losses if last else None)
        sync_shared_grads(stages)
        optimizer.step()
        if last:
            step_losses.append(float(torch.stack(losses).detach().mean()))
    held = {id(p) for p in params}
    return {
        "losses": step_losses,
        "params": {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in held},
    }


@dataclass(frozen=True)
class Case:
    """One (arch, schedule, micro-batches) of hf_zoo trained through to_torch_pipelining on 2 ranks."""

    arch: str
    schedule: str
    micro_batches: int = 4
    engine: bool = False  # through autopipe.pipeline(engine="torch") (what run --engine torch runs), not the export


@dataclass(frozen=True)
class Outcome:
    case: Case
    refused: str | None  # the one-line PlanError, where torch cannot run the plan
    loss_rel: float  # the largest relative difference of a step's loss from one-process training's
    weight_diff: float  # the largest absolute difference of a weight from one-process training's
    moved: float  # the largest change of a weight in one-process training (the comparison means something)
    seconds: float  # the ranks' time on the case (tracing included)


def plan_of(case: Case) -> Any:
    from tests.helpers import FIXTURES, even_plan

    virtual = 2 if case.schedule in ("zb-v", "dualpipe-v") else 1
    return even_plan(
        str(FIXTURES / "hf_zoo.py"),
        {"arch": case.arch},
        stages=2,
        virtual=virtual,
        schedule=case.schedule,
        micro_batches=case.micro_batches,
        micro_batch_size=2,
        reuse_trace=True,
    )


def reference(plan: Plan) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-step losses and final weights of the unsplit model, trained on the same micro-batches."""
    from autopipe.model.load import call_model

    loaded = rebuild_model(plan)
    model = loaded.model
    x: Any = loaded.make_inputs(plan.batch_size)
    y: Any = loaded.make_targets(plan.batch_size)  # type: ignore[misc]
    m = plan.micro_batches
    xs = [{k: v.chunk(m)[i] for k, v in x.items()} for i in range(m)] if isinstance(x, dict) else list(x.chunk(m))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        total = 0.0
        for xi, yi in zip(xs, y.chunk(m), strict=True):
            loss = loaded.loss_fn(call_model(model, xi), yi)
            (loss / m).backward()  # type: ignore[no-untyped-call]
            total += float(loss.detach()) / m
        optimizer.step()
        losses.append(total)
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def run_ranks(paths: list[str], folder: Path, timeout: float) -> list[dict[str, dict[str, Any]]]:
    """2 gloo ranks of this worker over ``paths`` (killed after ``timeout`` s); what each saved."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(r), "2", port, str(folder / f"rank{r}.pt"), *paths],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    from tests.helpers import wait_ranks

    wait_ranks(procs, timeout)
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(2)]


def check_cases(cases: list[Case], folder: Path, timeout: float = 600) -> list[Outcome]:
    """Plan every case, train them all in one pair of ranks, compare each with one-process training."""
    paths = []
    for k, case in enumerate(cases):
        path = folder / f"{k}-{case.arch}-{case.schedule}-{case.micro_batches}{'-engine' if case.engine else ''}.json"
        plan_of(case).save(path)
        paths.append(str(path))
    got = run_ranks(paths, folder, timeout)
    outcomes, references = [], {}
    for case, name in zip(cases, paths, strict=True):
        a, b = got[0][name], got[1][name]
        if "error" in a or "error" in b:
            errors = {a.get("error"), b.get("error")} - {None}
            outcomes.append(Outcome(case, " | ".join(sorted(map(str, errors))), 0.0, 0.0, 0.0, 0.0))
            continue
        plan = Plan.load(name)
        key = (case.arch, case.micro_batches)
        if key not in references:
            references[key] = reference(plan)
        want_losses, want = references[key]
        losses = a["losses"] or b["losses"]
        rel = max(abs(x - w) / abs(w) for x, w in zip(losses, want_losses, strict=True))
        held = {**a["params"], **b["params"]}
        start = dict(rebuild_model(plan).model.named_parameters())
        if not held or not set(held) <= set(start):
            raise AssertionError(f"{case}: the ranks hold none or unknown weights")
        diff = max(float((v - want[n]).abs().max()) for n, v in held.items())
        moved = max(float((want[n] - start[n].detach()).abs().max()) for n in held)
        rel = rel if len(losses) == STEPS else float("inf")
        outcomes.append(Outcome(case, None, rel, diff, moved, a["seconds"]))
    return outcomes


if __name__ == "__main__":
    main()
