"""autopipe.stages.agree: ranks with different PYTHONHASHSEEDs train as one process (2 gloo ranks
of agree_worker.py, each its own subprocess and environment); ranks that built the model
differently fail alike, in one line, at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autopipe.errors import RankMismatchError
from autopipe.graph.canon import reference_nodes
from autopipe.graph.trace import trace_model
from autopipe.model.load import load_model
from autopipe.stages.agree import StageDigest, agreed_split, check_digests, stage_digests
from autopipe.stages.split import split_model
from tests.fixtures.hash_order import KINDS
from tests.helpers import FIXTURES, even_plan, max_diff, reference_training, wait_ranks
from tests.stages.agree_worker import LR, MODEL, STEPS, pairs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_orders(seeds: range) -> dict[int, str]:
    """The order ``set(KINDS)`` iterates in under each PYTHONHASHSEED (a bare interpreter each)."""
    code = f"print(','.join(set({KINDS!r})))"
    out = {}
    for s in seeds:
        env = {**os.environ, "PYTHONHASHSEED": str(s)}
        out[s] = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip()
    return out


def distinct_seeds(n: int) -> list[int]:
    """``n`` PYTHONHASHSEEDs under which ``set(KINDS)`` iterates in ``n`` different orders."""
    seen: dict[str, int] = {}
    for s, order in set_orders(range(40)).items():
        seen.setdefault(order, s)
    assert len(seen) >= n, seen
    return sorted(seen.values())[:n]


def _plan(path: Path):  # type: ignore[no-untyped-def]
    plan = even_plan(MODEL, stages=2, schedule="interleaved-1f1b", virtual=2, micro_batches=4, reuse_trace=True)
    plan.save(path)
    return plan


def run_ranks(plan_file: Path, seeds: list[int], out: Path, skew: str = "", timeout: float = 240) -> list[str]:
    """One process per seed (its own PYTHONHASHSEED); together they run every pair of them as a
    2-rank group (agree_worker.py), process 1 with ``skew``; their logs."""
    ports = ",".join(str(_free_port()) for _ in pairs(len(seeds)))
    procs = []
    for me, seed in enumerate(seeds):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": str(seed)}
        cmd = [sys.executable, str(HERE / "agree_worker.py"), str(plan_file), str(out), str(me), str(len(seeds)), ports]
        procs.append(
            subprocess.Popen(
                [*cmd, *([skew] if skew else [])], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    logs = wait_ranks(procs, timeout)
    return logs


@pytest.mark.slow
@pytest.mark.timeout(400)  # hang-only: ten pairs of ranks on a busy 2-core machine
def test_ranks_with_different_hash_seeds_train_as_one_process(tmp_path: Path) -> None:
    plan = _plan(tmp_path / "plan.json")
    ref_losses, ref_state = reference_training(MODEL, {}, steps=STEPS, batch_size=plan.batch_size, lr=LR)
    ref_params = {k: v for k, v in ref_state.items() if not k.startswith("freq_")}  # buffers folded into the trace
    start = load_model(MODEL, {}).model.state_dict()
    assert max_diff(ref_params, {k: start[k] for k in ref_params}) > 1e-3  # training moved the weights
    seeds = distinct_seeds(5)  # every pair of them: ten seed pairs, each with two set orders
    run_ranks(tmp_path / "plan.json", seeds, tmp_path)
    assert len(pairs(5)) == 10
    for k, pair in enumerate(pairs(5)):
        got = [torch.load(tmp_path / f"pair{k}-rank{r}.pt", weights_only=True) for r in range(2)]
        for engine in ("autopipe", "torch"):
            for r in range(2):
                losses = got[r][engine]["losses"]
                assert max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)) <= TOL, (pair, engine, r)
            state = {**got[0][engine]["state"], **got[1][engine]["state"]}
            assert max_diff(state, ref_params) <= TOL, (pair, engine)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ranks_that_built_the_model_differently_fail_alike_in_one_line(tmp_path: Path) -> None:
    _plan(tmp_path / "plan.json")
    logs = run_ranks(tmp_path / "plan.json", distinct_seeds(2), tmp_path, skew="0.5", timeout=120)
    lines = [[ln for ln in log.splitlines() if ln.startswith("RANK-MISMATCH: ")] for log in logs]
    assert all(len(found) == 1 for found in lines), logs
    assert lines[0] == lines[1]  # the same line on both ranks: neither waits on the other
    assert "rank 1 traced another model than rank 0" in lines[0][0]
    assert "build the model the same way on every rank" in lines[0][0]
    assert all("Traceback" not in log for log in logs)


# ---------------------------------------------------------------------- in one process


def _traced_split(**kwargs: object):  # type: ignore[no-untyped-def]
    plan = even_plan(MODEL, stages=2, schedule="interleaved-1f1b", virtual=2, micro_batches=4, reuse_trace=True)
    torch.manual_seed(0)
    lm = load_model(str(FIXTURES / "hash_order.py"), dict(kwargs))
    traced = trace_model(lm.model, lm.make_inputs(2), micro_batch_size=2, recipe=plan.recipe)
    return plan, traced, split_model(traced, plan)


def test_one_rank_agrees_with_itself_in_one_gather() -> None:
    plan, traced, split = _traced_split()
    calls: list[object] = []

    def gather(obj: object) -> list[object]:
        calls.append(obj)
        return [obj]

    assert agreed_split(plan, traced, split, 0, gather) == (traced, split)
    assert len(calls) == 1  # the common case: one small exchange


def test_a_stage_whose_interface_differs_is_named_with_both_ranks() -> None:
    _, traced, split = _traced_split()
    mine = stage_digests(traced, split)
    swapped: list[StageDigest] = list(mine)
    j, ins, outs, _ = mine[2]
    swapped[2] = (j, (ins[0], ins[2], ins[1]), outs, "other")
    check_digests({0: mine, 1: list(mine)})
    with pytest.raises(RankMismatchError) as e:
        check_digests({0: mine, 1: swapped})
    msg = str(e.value)
    assert msg.startswith("ranks 0 and 1 disagree on stage 2's interface (inputs ")
    assert "\n" not in msg and "on rank 1); build the model the same way on every rank" in msg
    other = list(mine)
    other[1] = (*mine[1][:3], "other")
    with pytest.raises(RankMismatchError, match=r"stage 1's interface .* the same names but other shapes"):
        check_digests({0: mine, 1: other})


def test_a_rank_that_cannot_relabel_fails_every_rank() -> None:
    plan, traced, split = _traced_split()
    _, skewed, skewed_split = _traced_split(skew=0.5)

    def peer(*answers: object):  # type: ignore[no-untyped-def]
        """A gather whose other rank answers ``answers`` in turn (rank 0 first in the list)."""
        it = iter(answers)

        def gather(obj: object) -> list[object]:
            other = next(it)
            return [other, obj] if obj[0] == 1 else [obj, other]  # type: ignore[index]

        return gather

    # rank 1: rank 0's hash differs, then rank 0 sends its nodes, then says it is fine
    ours = peer((0, "x", stage_digests(traced, split)), (0, reference_nodes(traced), None), (0, None, []))
    with pytest.raises(RankMismatchError) as e:
        agreed_split(plan, skewed, skewed_split, 1, ours)
    msg = str(e.value)
    assert msg.startswith("rank 1 traced another model than rank 0 (rank 0's node ") and "\n" not in msg
    # rank 0: the same line, from rank 1's answer (no rank is left waiting)
    theirs = peer((1, "y", None), (1, None, None), (1, msg, None))
    with pytest.raises(RankMismatchError) as e0:
        agreed_split(plan, traced, split, 0, theirs)
    assert str(e0.value) == msg
