"""How much slower this host runs several ranks at once than one: measured, beside a CPU profile.

A profile times each block in one process. ``autopipe run`` then starts S ranks on the same
host, each on its own threads, and they share the cores with each other and with whatever else
runs there: on an idle 2-core machine two ranks run about as fast as one, four about half as
fast, and with one CPU-bound process beside them two ranks get about 2/3 of a core each (three
runnable processes on two cores) -- the run took 1.7-1.9x the profiled compute in that case
(``bench/bench_prediction.py``). That factor is not a constant of the machine; it is what the
host does at the time, so it is measured like the blocks are, and kept in the profile
(:class:`~autopipe.costs.profile.Contention`)::

    k workers, one thread each, run the same fixed unit of work (a small matmul and a streaming
    multiply, numpy) for the same short window, started together;
    slowdown(k) = units one worker alone does in a window / the mean units of the k workers

over ``rounds`` rounds that alternate the counts (k = 1, 2, 4, ... up to twice the cores, at
most :data:`MAX_WORKERS`), half before the blocks are timed and half after; each count's
median over the rounds is kept, with its spread (:func:`~autopipe.costs.measure.timing.relative_spread`).
The workers are plain Python processes with numpy (a dependency), started once and told
when to run over a pipe; they never import the user's model or torch. Anything that goes wrong
(no process can start, a worker does not answer within :data:`ANSWER_S`) leaves the profile
without contention, which the planner prices as one rank alone, and says so in the log.
"""

from __future__ import annotations

import logging
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from autopipe.costs.measure.timing import relative_spread
from autopipe.costs.profile import Contention

__all__ = ["ANSWER_S", "MAX_WORKERS", "Probe", "counts_for", "slowdowns"]

log = logging.getLogger("autopipe")

MAX_WORKERS = 16
"""The most workers measured at once; beyond it the planner extrapolates (``Contention.slowdown_at``)."""
WINDOW_S = 0.06  # one measurement window
ANSWER_S = 10.0  # a worker that has not answered by then (started, or a window) is given up on

_WORKER = r"""
import sys, time
import numpy as np
rng = np.random.default_rng(0)
a = rng.random((160, 160), dtype=np.float32); b = np.empty_like(a)
s = rng.random(1 << 19, dtype=np.float32); t = np.empty_like(s)
def unit():
    np.matmul(a, a, out=b)
    np.multiply(s, 1.0000001, out=t)
for _ in range(20):
    unit()
print("ready", flush=True)
for line in sys.stdin:
    start, stop = map(float, line.split())
    while time.monotonic() < start - 0.002:
        time.sleep(0.001)
    while time.monotonic() < start:
        pass
    n = 0
    while time.monotonic() < stop:
        unit()
        n += 1
    print(n, flush=True)
"""


def counts_for(cores: int) -> tuple[int, ...]:
    """The worker counts measured on a host of ``cores`` cores: 1, 2, 4, ... up to twice the
    cores (ranks beyond the cores are a plan's own oversubscription), the cores themselves, at
    most :data:`MAX_WORKERS`."""
    top = min(MAX_WORKERS, max(2, 2 * cores))
    ks = {1, min(cores, top)}
    k = 2
    while k <= top:
        ks.add(k)
        k *= 2
    return tuple(sorted(ks))


def slowdowns(rounds: Sequence[dict[int, list[int]]]) -> tuple[tuple[float, ...], tuple[float, ...], tuple[int, ...]]:
    """(median slowdown per count, its spread, the counts) from each round's units per worker
    (``{k: [units of each of the k workers]}``): a round's slowdown at k is its solo units over
    the mean of its k workers' units. Pure."""
    ks = sorted({k for r in rounds for k in r})
    per_k: dict[int, list[float]] = {k: [] for k in ks}
    for r in rounds:
        solo = r.get(1, [0])[0]
        for k, units in r.items():
            mean = sum(units) / len(units) if units else 0.0
            if solo > 0 and mean > 0:
                per_k[k].append(solo / mean)
    kept = [k for k in ks if per_k[k]]
    return (
        tuple(1.0 if k == 1 else statistics.median(per_k[k]) for k in kept),
        tuple(0.0 if k == 1 else relative_spread(per_k[k]) for k in kept),
        tuple(kept),
    )


@dataclass
class Probe:
    """The workers, started once (:meth:`start`), measured in rounds (:meth:`measure`) before and
    after the blocks are timed, read out as a Contention (:meth:`result`), stopped (:meth:`stop`).
    Use as a context manager; every failure is logged and leaves an empty result."""

    threads: int = 1
    cores: int = 0
    counts: tuple[int, ...] = ()
    _workers: tuple[subprocess.Popen[str], ...] = ()
    _rounds: tuple[dict[int, list[int]], ...] = ()
    _failed: bool = False
    _ready: bool = False

    def __enter__(self) -> Probe:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the workers (Python and numpy, ~0.2 s each) and return: the caller goes on
        (traces the model) while they start; the first :meth:`measure` waits for them."""
        self.cores = self.cores or os.cpu_count() or 1
        self.counts = counts_for(self.cores)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            self._workers = tuple(
                subprocess.Popen(
                    [sys.executable, "-c", _WORKER],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=env,
                )
                for _ in range(max(self.counts))
            )
        except OSError as e:
            self._give_up(e)

    def measure(self, rounds: int) -> None:
        """``rounds`` rounds, each every count once (solo first)."""
        if rounds and not self._ready and not self._failed and self._workers:
            try:
                for w in self._workers:
                    self._answer(w)
            except (OSError, _NoAnswer) as e:
                self._give_up(e)
            self._ready = True
        for _ in range(rounds):
            if self._failed or not self._workers:
                return
            got: dict[int, list[int]] = {}
            try:
                for k in self.counts:
                    start = time.monotonic() + 0.01
                    for w in self._workers[:k]:
                        assert w.stdin is not None
                        w.stdin.write(f"{start} {start + WINDOW_S}\n")
                        w.stdin.flush()
                    got[k] = [int(self._answer(w)) for w in self._workers[:k]]
            except (OSError, ValueError, _NoAnswer) as e:
                self._give_up(e)
                return
            self._rounds += (got,)

    def result(self) -> Contention:
        if self._failed or not self._rounds:
            return Contention()
        slow, spread, ks = slowdowns(self._rounds)
        if not ks or ks[0] != 1:
            return Contention()
        return Contention(
            ks, tuple(round(x, 4) for x in slow), tuple(round(x, 4) for x in spread), self.cores, self.threads
        )

    def stop(self) -> None:
        for w in self._workers:
            if w.poll() is None:
                w.kill()
            w.wait()
            for f in (w.stdin, w.stdout):
                if f is not None:
                    f.close()
        self._workers = ()

    def _answer(self, w: subprocess.Popen[str]) -> str:
        assert w.stdout is not None
        ready, _, _ = select.select([w.stdout], [], [], ANSWER_S)
        line = w.stdout.readline() if ready else ""
        if not line:
            raise _NoAnswer(f"a worker did not answer within {ANSWER_S:.0f} s")
        return line.strip()

    def _give_up(self, why: Exception) -> None:
        self._failed = True
        log.warning("could not measure how ranks share this host (%s); planned as one rank alone", why)
        self.stop()


class _NoAnswer(Exception):
    pass
