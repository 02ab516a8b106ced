"""autopipe.stages.export: plans as torch.distributed.pipelining stages and schedules (2 gloo
ranks: export_worker.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autopipe.errors import PlanError
from autopipe.stages.export import relay_stages, to_torch_pipelining
from autopipe.stages.rebuild import rebuild_model, trace_for_plan
from autopipe.stages.split import split_model
from tests.helpers import even_plan
from tests.stages.export_worker import CONFIGS, LR, STEPS, plan_for

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reference(name: str, world: int) -> dict[str, torch.Tensor]:
    plan = plan_for(name, world)
    loaded = rebuild_model(plan)
    model = loaded.model
    x, y = loaded.make_inputs(plan.batch_size), loaded.make_targets(plan.batch_size)  # type: ignore[misc]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    m = plan.micro_batches
    for _ in range(STEPS):
        optimizer.zero_grad()
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            (loaded.loss_fn(model(xi), yi) / m).backward()
        optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.slow
def test_two_rank_training_matches_one_process(tmp_path: Path) -> None:
    world, port = 2, str(_free_port())
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "export_worker.py"), str(r), str(world), port, str(tmp_path / f"rank{r}.pt")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=150)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
    for name in CONFIGS:
        want = _reference(name, world)
        seen = set()
        for r in range(world):
            for pname, value in got[r][name].items():
                diff = float((value - want[pname]).abs().max())
                assert diff <= 1e-5, (name, r, pname, diff)
                seen.add(pname)
        assert seen == set(want), (name, set(want) - seen)
        start = rebuild_model(plan_for(name, world)).model.named_parameters()
        moved = max(float((want[n] - p.detach()).abs().max()) for n, p in start)
        assert moved > 1e-3, name  # training changed the weights, so the comparison means something


@pytest.mark.parametrize(("model", "stages", "virtual"), [("unet.py", 2, 2), ("gpt.py", 2, 2), ("resnet.py", 3, 1)])
def test_relay_chain_is_the_model(model: str, stages: int, virtual: int) -> None:
    plan = even_plan(model, stages=stages, virtual=virtual)
    loaded = rebuild_model(plan)
    inputs = loaded.make_inputs(plan.micro_batch_size)
    traced = trace_for_plan(plan, loaded.model, inputs)
    relays = relay_stages(split_model(traced, plan), {n.name: i for i, n in enumerate(traced.gm.graph.nodes)})
    model_ = loaded.model.eval()
    with torch.no_grad():
        values: object = (inputs,)
        for relay in relays:
            values = relay(*values)  # type: ignore[misc]
        want = model_(inputs)
    assert torch.equal(values, want)  # type: ignore[arg-type]
    if model == "unet.py":  # the long skips ride through the middle stages
        assert len(relays[1].carry_out) > 1 and len(relays[2].carry_in) > 1


def test_bad_rank_and_fingerprint() -> None:
    plan = even_plan("mlp.py")
    loaded = rebuild_model(plan)
    with pytest.raises(PlanError, match="rank 5 is outside"):
        to_torch_pipelining(plan, loaded.model, 5, example_inputs=loaded.make_inputs(2))
    other = rebuild_model(even_plan("mlp.py", ("depth=4",)))
    with pytest.raises(PlanError, match="made for another model"):
        to_torch_pipelining(plan, other.model, 0, example_inputs=other.make_inputs(2))


def test_balance_is_blocks_per_stage() -> None:
    plan = even_plan("mlp.py", stages=3)
    assert plan.balance == tuple(len(s.blocks) for s in plan.stages)
    assert sum(plan.balance) == len({b for s in plan.stages for b in s.blocks})
