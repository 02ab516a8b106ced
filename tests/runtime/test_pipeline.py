"""autopipe.pipeline: a user's own training loop (their optimizer, their batches) on thread
ranks equals unsplit training; checkpoints through the pipe; the README's torchrun script runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from autopipe import Pipeline, pipeline
from autopipe.errors import RuntimeFailure
from autopipe.model.load import load_model
from autopipe.runtime.comm import Comm, ThreadHub
from tests.helpers import ROOT, even_plan, max_diff
from tests.runtime.helpers import GPT, LR, STEPS, TOL, cached_plan, unsplit_reference
from tests.runtime.helpers import on_threads as _on_threads

torch.set_num_threads(1)


def _comm(hub: ThreadHub, rank: int) -> Callable[[list[tuple[int, ...]]], Comm]:
    return lambda groups: hub.comm(rank)


def _model() -> Any:
    torch.manual_seed(0)
    return load_model(GPT[0], GPT[1])


def test_your_own_loop_equals_unsplit_training_and_checkpoints_through_the_pipe() -> None:
    plan = cached_plan("gpt", 2, "1f1b")
    lm = _model()
    batches = []
    for k in range(STEPS):  # the reference's batches (models/gpt.py: a fixed batch)
        torch.manual_seed(k + 1)
        batches.append((lm.make_inputs(8), lm.make_targets(8)))

    hub = ThreadHub(2, 30.0)
    pipes = []
    for rank in range(2):  # built one after the other: tracing is not thread-safe
        mine = _model()
        pipes.append(
            pipeline(
                plan,
                mine.model,
                rank=rank,
                comm=_comm(hub, rank),
                device="cpu",
                example_inputs=mine.make_inputs(2),
                loss_fn=mine.loss_fn,
            )
        )

    def work(rank: int) -> tuple[list[float], dict[str, torch.Tensor], Pipeline]:
        pipe = pipes[rank]
        opt = torch.optim.SGD(pipe.parameters(), lr=LR)
        losses = []
        for x, y in batches:  # rank 1 holds no input-reading stage: it passes the targets only
            losses.append(pipe.step(x if rank == 0 else None, y if rank == 1 else None))
            opt.step()
            opt.zero_grad()
        return losses, pipe.state_dict(), pipe

    (l0, s0, p0), (l1, s1, p1) = _on_threads(hub, work)
    ref_losses, ref_state = unsplit_reference("gpt")
    assert l0 == l1  # the last rank's loss, broadcast
    assert max(abs(a - b) for a, b in zip(l1, ref_losses, strict=True)) <= TOL
    assert set(s0) | set(s1) == set(ref_state)  # original names, the tied weight under both
    assert max_diff({**s0, **s1}, ref_state) <= TOL
    fresh = _model().model.state_dict()
    p1.load_state_dict(fresh)  # the whole model's state_dict: the rank takes its part
    assert max_diff(p1.state_dict(), {k: fresh[k] for k in s1}) == 0.0
    with pytest.raises(RuntimeFailure, match=r"the state has no blocks\.1\.\S+ \(and \d+ more\) for rank 1"):
        p1.load_state_dict(s0)
    assert not p0.eval()._modules[0].training and p0.train()._modules[0].training


def test_bad_batches_and_ranks_get_one_line() -> None:
    plan = cached_plan("gpt", 2, "1f1b")
    lm = _model()
    with pytest.raises(RuntimeFailure, match=r"example_inputs have 8 samples .* not 2; pass one micro-batch"):
        pipeline(plan, lm.model, rank=0, comm=lambda g: ThreadHub(2, 1.0).comm(0), example_inputs=lm.make_inputs(8))
    with pytest.raises(RuntimeFailure, match=r"rank 5: the plan has ranks 0 to 1"):
        pipeline(plan, lm.model, rank=5, comm=lambda g: ThreadHub(2, 1.0).comm(0), example_inputs=lm.make_inputs(2))
    pipe = pipeline(plan, lm.model, rank=0, comm=lambda g: ThreadHub(2, 1.0).comm(0), example_inputs=lm.make_inputs(2))
    with pytest.raises(
        RuntimeFailure, match=r"step 0's inputs have 6 samples .* not 8; give batches of plan.batch_size = 8"
    ):
        pipe.step(lm.make_inputs(6))
    with pytest.raises(RuntimeFailure, match="rank 0 runs stages that read the model's inputs; pass the batch"):
        pipe.step(None, lm.make_targets(8))
    with pytest.raises(RuntimeFailure, match="unknown engine 'jax'; use one of: autopipe, torch"):
        pipeline(plan, lm.model, rank=0, engine="jax")


def _docs_block() -> str:
    """docs/runtime.md's Hugging Face training script (the README's own-loop section links it)."""
    text = (ROOT / "docs" / "runtime.md").read_text()
    match = re.search(r"```python\n(# hf_train\.py.*?)```", text, re.S)
    assert match is not None
    return match.group(1)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_readme_training_script_runs_as_written_under_torchrun(tmp_path: Path) -> None:
    """docs/runtime.md's script, as written, on its Hugging Face GPT-2 (models/hf_gpt2.py)."""
    pytest.importorskip("transformers")
    (tmp_path / "models").mkdir()
    for name in ("hf_gpt2.py", "chargpt.py", "gpt.py"):  # hf_gpt2 imports chargpt, which imports gpt
        shutil.copy(ROOT / "models" / name, tmp_path / "models" / name)
    model_file = str(tmp_path / "models" / "hf_gpt2.py")
    plan = even_plan(model_file, {}, stages=2, micro_batches=4, micro_batch_size=2)
    plan.save(tmp_path / "hf-plan.json")  # the file name the script loads
    (tmp_path / "train.py").write_text(_docs_block())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py"]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stderr[-2000:]
    losses = [float(x) for x in re.findall(r"step \d+ loss ([\d.]+)", done.stdout)]
    assert len(losses) == 5 and losses[-1] < losses[0] - 0.5, done.stdout  # from ~ln(128) = 4.85, falling
    state = {**torch.load(tmp_path / "hf-checkpoint-rank0.pt"), **torch.load(tmp_path / "hf-checkpoint-rank1.pt")}
    assert set(state) == set(load_model(model_file).model.state_dict())
