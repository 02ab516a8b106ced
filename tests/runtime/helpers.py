"""The models, cached plans and single-process references the runtime tests share
(``from tests.runtime.helpers import cached_plan``; the general helpers are in tests/helpers.py)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from autopipe.plans import Plan
from autopipe.runtime import Rebuilt, RunOptions, assemble_state_dict, rebuild, run_threads
from autopipe.runtime.comm import ThreadHub
from autopipe.runtime.run.records import RunResult
from autopipe.schedules import schedule_spec
from tests.helpers import even_plan, reference_training

GPT = ("models/gpt.py", {"n_layer": 2, "n_embd": 32, "vocab_size": 64, "block_size": 16})
SKIP = ("tests/fixtures/skip_mlp.py", {})
HF = ("tests/fixtures/hf_gpt2.py", {})
GPT4 = ("models/gpt.py", {**GPT[1], "n_layer": 4})  # 8 blocks: interleaved on 4 ranks
HF4 = ("tests/fixtures/hf_gpt2.py", {"n_layer": 4})
MODELS = {"gpt": GPT, "skip": SKIP, "hf": HF, "gpt4": GPT4, "hf4": HF4}


FAULTY = "tests/fixtures/faulty.py"
STEPS, LR, TOL = 3, 0.1, 1e-5


@functools.cache
def unsplit_reference(model: str, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor]]:
    file, kwargs = MODELS[model]
    return reference_training(file, kwargs, steps=steps, batch_size=8, lr=LR)


@functools.cache
def cached_plan(model: str, stages: int, schedule: str, virtual: int = 1, recompute: tuple[int, ...] = ()) -> Plan:
    file, kwargs = MODELS[model]
    m = max(4, schedule_spec(schedule).least_micro_batches(stages))  # dualpipe-v: 2 per rank
    return even_plan(
        file,
        kwargs,
        stages=stages,
        schedule=schedule,
        virtual=virtual,
        micro_batches=m,
        micro_batch_size=8 // m,
        recompute=recompute,  # the batch of 8 unsplit_reference trains
        reuse_trace=True,  # one trace per model and micro-batch size for all its plans
    )


def run_and_assemble(
    plan: Plan, tmp: Path, steps: int = STEPS, **kw: object
) -> tuple[RunResult, dict[str, torch.Tensor]]:
    folder = tmp / "ckpt"
    opts = RunOptions(steps=steps, optimizer="SGD", lr=LR, timeout_s=30, save_checkpoint=str(folder), **kw)  # type: ignore[arg-type]
    result = RunResult(tuple(run_threads(plan, opts, rebuilt_for(plan))))
    return result, assemble_state_dict(folder)


_REBUILT: dict[tuple[str, int], Rebuilt] = {}


def rebuilt_for(plan: Plan) -> Rebuilt:
    """Trace each model once for all its plans (the plans differ only in their cuts)."""
    key = (plan.recipe.model_file, plan.micro_batch_size)
    if key not in _REBUILT:
        _REBUILT[key] = rebuild(plan)
    return _REBUILT[key]


def skip_without_transformers(model: str) -> None:
    """Skip a Hugging Face case where transformers is not installed."""
    if model.startswith("hf"):
        pytest.importorskip("transformers")


def on_threads(hub: ThreadHub, work: Callable[[int], Any]) -> list[Any]:
    """``work(rank)`` on one thread per rank of ``hub``; the first error is raised here."""
    ranks = hub.world
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except BaseException as e:
            errors.append(e)
            hub.fail(f"rank {rank}: {e}")

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return [results[r] for r in range(ranks)]


def fake_checkpoint(
    folder: Path, step: int = 4, fingerprint: str = "abc", stages: int = 2, ranks: int = 2, optimizer: str = "Adam"
) -> Path:
    """A checkpoint folder whose manifest is right (small stage and rank files of no model):
    what the launcher's checks read of one."""
    from autopipe.runtime.checkpoint import file_entry
    from autopipe.runtime.commit import write_meta

    folder.mkdir(parents=True, exist_ok=True)
    for j in range(stages):
        torch.save({f"w{j}": torch.zeros(2)}, folder / f"stage-{j}.pt")
    for r in range(ranks):
        torch.save({"optimizer": {"state": {}, "param_groups": []}}, folder / f"rank-{r}.pt")
    files = {p.name: file_entry(p) for p in folder.glob("*.pt")}
    write_meta(
        folder,
        fingerprint=fingerprint,
        step=step,
        stages=stages,
        files=files,
        optimizer={"name": optimizer, "lr": 1e-3, "args": {}},
    )
    return folder
