"""The schedule CSV of a plan whose schedule torch has no class for (V-Half, ZB-H2) run by
torchtitan's own code in 2 gloo ranks (titan_csv_worker.py): the recipe ``autopipe config --for
torchtitan`` writes, read by torchtitan's ConfigManager; its ``_pipeline_module_split`` and
``_build_pipeline_schedule``, which loads the CSV ``autopipe emit --schedule-csv`` wrote into
torch's ``_PipelineScheduleRuntime``. One step gives one process's micro-batch losses and
gradients. torchtitan 0.3.0 (the ``titan`` extra), and main where ``AUTOPIPE_TORCHTITAN_MAIN``
names a checkout (as in test_titan_own_code.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_torchtitan import _gpt_like
from titan_csv_worker import BATCH, MICRO, data, loss_of

from autopipe.config import torchtitan_recipe
from autopipe.plans import Plan
from autopipe.stages.schedule_csv import torch_rows, write_schedule_csv
from tests.stages.test_export import _free_port

HERE = Path(__file__).resolve().parent
V_SPLIT = (("tok_embeddings", "layers.0"), ("layers.1",), ("layers.2",), ("layers.3", "norm", "output"))
SPLIT = (("tok_embeddings", "layers.0", "layers.1"), ("layers.2", "layers.3", "norm", "output"))
MB = BATCH // MICRO  # samples per micro-batch
PLANS = {
    "v_half": _gpt_like(split=V_SPLIT, schedule="v-half", virtual=2, micro_batches=MICRO, micro_batch_size=MB),
    "zb_h2": _gpt_like(split=SPLIT, schedule="zb-h2", micro_batches=MICRO, micro_batch_size=MB),
}


def _reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process: each micro-batch's loss, and the gradients of their sum (torchtitan: scale_grads=False)."""
    model, tokens, labels = data()
    losses = [loss_of(model(x), y) for x, y in zip(tokens.chunk(MICRO), labels.chunk(MICRO), strict=True)]
    torch.stack(losses).sum().backward()
    return [float(x) for x in losses], {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _ranks(folder: Path, modules: list[str], path: str) -> list[dict[str, Any]]:
    """Start 2 gloo ranks of titan_csv_worker.py (killed after 240 s), ``path`` first on their
    sys.path, then the repository and what this process has; what each saved."""
    root = str(HERE.parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (path, root, os.environ.get("PYTHONPATH", "")) if p),
        "OMP_NUM_THREADS": "1",
    }
    port, args = str(_free_port()), [str(folder), *modules]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "titan_csv_worker.py"), str(r), "2", port, str(folder / f"rank{r}.pt"), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = []
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(2)]


def _whole_name(fqns: list[str], name: str) -> str:
    """A stage's parameter name in the whole model: torchtitan renumbers the layers it keeps from 0."""
    kept = sorted(int(f.split(".")[1]) for f in fqns if f.startswith("layers."))
    head, _, rest = name.partition(".")
    if head != "layers":
        return name
    k, _, tail = rest.partition(".")
    return f"layers.{kept[int(k)]}.{tail}"


def _check(version: str, tmp_path: Path, path: str = "") -> None:
    modules = []
    for name, plan in PLANS.items():
        module = f"r_{version.replace('.', '_')}_{name}"
        (tmp_path / f"{module}.py").write_text(
            torchtitan_recipe(plan, module=module, version=version, plan_file=f"{name}.json")
        )
        write_schedule_csv(plan, tmp_path / f"{name}.schedule.csv")
        modules.append(module)
    got = _ranks(tmp_path, modules, path)
    want_losses, want_grads = _reference()
    for module, (name, plan) in zip(modules, PLANS.items(), strict=True):
        rows = torch_rows(plan)
        seen: set[str] = set()
        for rank in range(2):
            built = got[rank][module]
            assert built["class"] == "_PipelineScheduleRuntime" and built["csv"] == f"{name}.schedule.csv", built
            assert built["placement"] == ("ZBVZeroBubble" if plan.virtual == 2 else "1F1B"), built
            assert built["stages"] == [s.index for s in plan.stages if s.rank == rank], (name, rank)
            assert built["order"] == dict(enumerate(rows)), name  # the plan's exact order, as loaded
            for key, grad in built["grads"].items():
                stage, _, pname = key.partition(":")
                whole = _whole_name(list(plan.stages[int(stage)].blocks), pname)
                assert float((grad - want_grads[whole]).abs().max()) <= 1e-5, (name, key)
                seen.add(whole)
        assert seen == set(want_grads), name
        losses = got[0][module]["losses"] or got[1][module]["losses"]
        assert len(losses) == MICRO and all(
            abs(a - b) <= 1e-6 * abs(b) for a, b in zip(losses, want_losses, strict=True)
        ), name


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchtitan_0_3_0_runs_the_v_half_and_zb_h2_csvs_as_one_process(tmp_path: Path) -> None:
    version = str(getattr(pytest.importorskip("torchtitan"), "__version__", ""))
    if not version.startswith("0.3."):
        pytest.skip(f"torchtitan {version} is installed, this checks 0.3.x")
    _check("0.3.0", tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchtitan_main_runs_the_v_half_and_zb_h2_csvs_as_one_process(tmp_path: Path) -> None:
    where = os.environ.get("AUTOPIPE_TORCHTITAN_MAIN", "")
    if not where or not (Path(where.split(os.pathsep)[0]) / "torchtitan" / "config" / "configs.py").is_file():
        pytest.skip("no torchtitan main checkout: set AUTOPIPE_TORCHTITAN_MAIN to the folder that holds its package")
    _check("main", tmp_path, where)


def test_the_plans_here_have_no_torch_class() -> None:
    """The point of the CSV: torch's get_schedule_class has no V-Half or ZB-H2."""
    for plan in PLANS.values():
        text = torchtitan_recipe(plan, plan_file="p.json")
        assert isinstance(plan, Plan) and "config.parallelism.pipeline_parallel_schedule_csv = " in text
