"""autopipe's torchtitan outputs read by torchtitan's own config code (tools/titan_load.py in a
subprocess): 0.3.0 recipes (the ``titan`` test extra), 0.2.2 TOML (``.venv/torchtitan-0.2.2``, a
``pip install --no-deps --target`` that .ci/run makes) and main recipes (a checkout named by
``AUTOPIPE_TORCHTITAN_MAIN``: the folder that holds its ``torchtitan`` package, with any of main's
extra import-time dependencies on ``sys.path`` as well, ``os.pathsep``-separated). Each skips when
its torchtitan is absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_torchtitan import _loader_plans  # the same plans the in-process checks read

from autopipe.config import torchtitan_recipe, torchtitan_toml
from autopipe.plans import Plan

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "titan_load.py"
TOML_DIR = ROOT / ".venv" / "torchtitan-0.2.2"
PLACED_V = {"zb-v", "dualpipe-v", "v-half"}  # plans whose stages torchtitan must build in a V


def _load(files: list[Path], path: str) -> dict[str, dict[str, Any]]:
    """torchtitan's reading of each file, by file stem (tools/titan_load.py, ``path`` first on sys.path)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run(
        [sys.executable, str(TOOL), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=files[0].parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = [json.loads(line) for line in done.stdout.splitlines()]
    return {Path(r["file"]).stem.split("__")[-1]: r for r in read}


def _common(name: str, plan: Plan, got: dict[str, Any]) -> None:
    """What every version says alike: degrees, parts, schedule, CSV, recomputation."""
    par = got["parallelism"]
    assert par["pipeline_parallel_degree"] == plan.devices, name
    assert par["tensor_parallel_degree"] == plan.tensor_parallel, name
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == plan.data_parallel, name
    assert par["module_fqns_per_model_part"] == [list(s.blocks) for s in plan.stages], name
    csv = par["pipeline_parallel_schedule_csv"]
    assert bool(csv) == (name == "v-half"), name  # torch has a class for every other schedule here
    if csv:
        assert csv == f"{name}.schedule.csv" and par["pipeline_parallel_schedule"] == "ZBVZeroBubble", name
    for rank, stages in enumerate(got["placed"]):
        assert sorted(stages) == [s.index for s in plan.stages if s.rank == rank], (name, rank)
    if got["placed"] and name in PLACED_V:
        assert got["placed"][0] == [0, 2 * plan.devices - 1], name


def _recipes(tmp_path: Path, version: str) -> tuple[dict[str, Plan], list[Path]]:
    plans = _loader_plans()
    files = []
    for name, plan in plans.items():
        module = f"r{version.replace('.', '_')}__{name}".replace("-", "_")
        text = torchtitan_recipe(plan, module=module, version=version, plan_file=f"{name}.json")
        files.append(tmp_path / f"{module}.py")
        files[-1].write_text(text)
    return {n.replace("-", "_"): p for n, p in plans.items()}, files


def _name(key: str) -> str:
    return key.replace("_", "-")


@pytest.mark.slow  # a subprocess imports torchtitan (about 20 s)
def test_torchtitan_0_3_0_reads_every_recipe_in_a_subprocess(tmp_path: Path) -> None:
    version = str(getattr(pytest.importorskip("torchtitan"), "__version__", ""))
    if not version.startswith("0.3."):
        pytest.skip(f"torchtitan {version} is installed, this checks 0.3.x")
    plans, files = _recipes(tmp_path, "0.3.0")
    read = _load(files, "")
    assert sorted(read) == sorted(plans)
    for key, plan in plans.items():
        got, name = read[key], _name(key)
        assert got["torchtitan"].startswith("0.3."), got["torchtitan"]
        _common(name, plan, got)
        training, par = got["training"], got["parallelism"]
        assert par["pipeline_parallel_microbatch_size"] == plan.micro_batch_size, name
        assert training["local_batch_size"] == (plan.batch_size if plan.devices > 1 else plan.micro_batch_size), name
        assert training["global_batch_size"] == plan.batch_size * plan.data_parallel, name
        assert got["activation_checkpoint"] == ("FullAC.Config" if name == "recompute" else "none"), name


@pytest.mark.slow  # a subprocess imports torchtitan (about 20 s)
def test_torchtitan_main_reads_every_recipe_in_a_subprocess(tmp_path: Path) -> None:
    where = os.environ.get("AUTOPIPE_TORCHTITAN_MAIN", "")
    if not where or not (Path(where.split(os.pathsep)[0]) / "torchtitan" / "config" / "configs.py").is_file():
        pytest.skip("no torchtitan main checkout: set AUTOPIPE_TORCHTITAN_MAIN to the folder that holds its package")
    plans, files = _recipes(tmp_path, "main")
    read = _load(files, where)
    assert sorted(read) == sorted(plans)
    for key, plan in plans.items():
        got, name = read[key], _name(key)
        _common(name, plan, got)
        training, par = got["training"], got["parallelism"]
        seq = training["max_context_length"]  # the base recipe's: tokens per sample
        assert "local_batch_size" not in training and "pipeline_parallel_microbatch_size" not in par  # #4121
        assert training["num_tokens_per_microbatch_per_dp_rank"] == plan.micro_batch_size * seq, name
        assert training["num_tokens_per_train_step"] == plan.batch_size * plan.data_parallel * seq, name
        micro = par["num_pp_microbatches"] if plan.devices > 1 else 1  # as torchtitan's trainer counts them
        per_rank = training["num_tokens_per_microbatch_per_dp_rank"] * micro
        steps = training["num_tokens_per_train_step"] // (per_rank * plan.data_parallel)
        assert steps * micro == plan.micro_batches, name  # gradient accumulation x pipeline micro-batches
        assert got["activation_checkpoint"] == ("FullAC.Config" if name == "recompute" else "none"), name


@pytest.mark.slow  # a subprocess imports torchtitan (about 20 s)
def test_torchtitan_0_2_2_reads_every_toml_in_a_subprocess(tmp_path: Path) -> None:
    if not (TOML_DIR / "torchtitan" / "config" / "job_config.py").is_file():
        pytest.skip(f"no torchtitan 0.2.2 at {TOML_DIR} (.ci/run installs it there)")
    plans = {n.replace("-", "_"): p for n, p in _loader_plans().items()}
    files = []
    for key, plan in plans.items():
        files.append(tmp_path / f"v0_2__{key}.toml")
        files[-1].write_text(torchtitan_toml(plan, plan_file=f"{_name(key)}.json"))
    read = _load(files, str(TOML_DIR))
    for key, plan in plans.items():
        got, name = read[key], _name(key)
        assert got["torchtitan"].startswith("0.2.2") and got["from"].startswith(str(TOML_DIR)), got["from"]
        _common(name, plan, got)
        training, par = got["training"], got["parallelism"]
        assert training["global_batch_size"] == plan.batch_size * plan.data_parallel, name
        assert training["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == (
            plan.micro_batches if plan.devices > 1 else 1
        ), name
        assert par["pipeline_parallel_expert_parallel_overlap"] == (name != "dualpipe-v"), name
        assert got["activation_checkpoint"] == ("full" if name == "recompute" else "none"), name
