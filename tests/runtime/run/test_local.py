"""Thread ranks (run_threads): the batches processes would draw, errors raised."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch

from autopipe.errors import RuntimeFailure
from autopipe.runtime import Rebuilt, RunOptions, assemble_state_dict, run_threads
from autopipe.runtime.run.records import RunResult
from tests.helpers import even_plan, max_diff
from tests.runtime.helpers import (
    FAULTY,
    LR,
    STEPS,
    TOL,
    cached_plan,
    rebuilt_for,
    unsplit_reference,
)

torch.set_num_threads(1)


def test_thread_ranks_get_the_batches_processes_draw(tmp_path: Path) -> None:
    """A recomputed stage sets and restores the global RNG in its backward, while other
    thread-ranks would be drawing their next batch from it: run_threads draws them first.
    A slow ``example_inputs`` (a data loader) makes the race it closes all but certain."""
    plan = cached_plan("skip", 4, "1f1b", 1, (1, 2))
    base = rebuilt_for(plan)
    draw = base.loaded.make_inputs

    def slow(batch_size: int) -> object:
        time.sleep(0.002)
        return draw(batch_size)

    slow_base = Rebuilt(dataclasses.replace(base.loaded, make_inputs=slow), base.traced)
    opts = RunOptions(steps=STEPS, optimizer="SGD", lr=LR, timeout_s=30, save_checkpoint=str(tmp_path))
    result = RunResult(tuple(run_threads(plan, opts, slow_base)))
    ref_losses, ref_state = unsplit_reference("skip")
    assert max(abs(a - b) for a, b in zip(result.losses, ref_losses, strict=True)) <= TOL
    assert max_diff(assemble_state_dict(tmp_path), ref_state) <= TOL


def test_thread_rank_error_is_raised() -> None:
    plan = even_plan(FAULTY, stages=2, micro_batches=4, leaf_modules=("Bomb",))
    with pytest.raises(RuntimeFailure, match="unknown optimizer"):
        run_threads(plan, RunOptions(optimizer="NoSuchOpt"))
