"""Run every rank of a plan as a thread of this process (no torch.distributed, no ports).

The same engine and worker as ``autopipe run``, with in-memory mailboxes
(:class:`~autopipe.runtime.comm.ThreadHub`): for tests, and for debugging a plan in a
debugger. The first rank to raise makes the others fail fast (their waits see the failure);
its exception is raised again here. Timings are not meaningful (threads share the GIL), and
a rank's ``peak_tensor_bytes`` also counts the copies its sends leave in the mailboxes.

The threads share torch's global RNG, which a recomputed stage sets and restores during its
backward: so every step's batch is drawn here, before the threads start, and each rank gets
its own copy. A model that draws random numbers in its forward (dropout) is not reproducible
as threads; ``autopipe run`` (one process per rank) is.
"""

from __future__ import annotations

import threading

import torch

from autopipe.errors import RunOptionError
from autopipe.plans import Plan
from autopipe.runtime import checkpoint
from autopipe.runtime.comm import Comm, ThreadHub
from autopipe.runtime.run.data import Batch, BatchSource
from autopipe.runtime.run.options import RunOptions
from autopipe.runtime.run.worker import RankResult, Rebuilt, rebuild, train_rank

__all__ = ["run_threads"]


def run_threads(plan: Plan, options: RunOptions, rebuilt: Rebuilt | None = None) -> list[RankResult]:
    """``plan`` on ``plan.devices`` threads; one result per rank. Rebuilds the model once.

    torch runs each op on ``options.threads`` threads meanwhile (as every rank process of
    ``launch`` does), so the two give the same numbers bit for bit.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(options.threads)
    try:
        return _run_threads(plan, options, rebuilt)
    finally:
        torch.set_num_threads(before)


def _run_threads(plan: Plan, options: RunOptions, rebuilt: Rebuilt | None) -> list[RankResult]:
    if options.engine != "autopipe":
        raise RunOptionError(
            f"--engine {options.engine} runs on torch.distributed processes, not threads; use autopipe run (launch)"
        )
    base = rebuilt if rebuilt is not None else rebuild(plan, options.seed)
    hub = ThreadHub(plan.devices, options.timeout_s)
    results: dict[int, RankResult] = {}
    errors: list[tuple[int, BaseException]] = []
    copies = [base.copy() for _ in range(plan.devices)]
    done = int(checkpoint.read_meta(options.resume)["step"]) if options.resume else 0
    source = BatchSource(base.loaded, plan.batch_size, options.seed)
    drawn = {k: source.batch(k) for k in range(done, done + options.steps)}

    def batches(k: int) -> Batch:
        inputs, targets = torch.utils._pytree.tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) else t, drawn[k]
        )
        return inputs, targets

    def work(rank: int) -> None:
        def comm(groups: list[tuple[int, ...]]) -> Comm:
            return hub.comm(rank)

        try:
            results[rank] = train_rank(plan, rank, comm, options, copies[rank], batches, process_memory=False)
        except BaseException as e:
            errors.append((rank, e))
            hub.fail(f"rank {rank}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(plan.devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0][1]
    return [results[r] for r in range(plan.devices)]
