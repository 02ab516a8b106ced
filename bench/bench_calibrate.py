# Run: PYTHONPATH=. python bench/bench_calibrate.py   (repository root; ~30 s)
"""How close the analytic profile comes to a measured one on this CPU after calibration.

models/gpt.py (its default size) profiled on one thread at micro-batch sizes 4 and 8, three
times, each block keeping its fastest run; ``calibrate`` fits the efficiencies to it; then the
analytic profile, priced with the fitted device, beside the measurement for the blocks that take
a meaningful time (over 10% of the largest forward). Times are this thread's CPU time, not wall
time, so other processes on the machine count less. (tests/costs/test_calibrate.py checks the fit
itself, on block times made from known efficiencies.)
"""

from __future__ import annotations

import dataclasses
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from autopipe.costs import devices
from autopipe.costs.analytic import analytic_profile
from autopipe.costs.calibrate import calibrate
from autopipe.costs.measure import timing
from autopipe.costs.measure.measured import profile_model
from autopipe.costs.profile import Affine, Profile
from autopipe.model.load import load_model

GPT = str(Path(__file__).resolve().parent.parent / "models" / "gpt.py")
SIZES = (4, 8)


def _cpu_time_once(fn: Callable[[], object]) -> float:
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def _cpu_best_time(fn: Callable[[], object], repeat: int) -> float:
    fn()
    return max(min(_cpu_time_once(fn) for _ in range(repeat)), 1e-9)


def _fastest(runs: list[Profile]) -> Profile:
    """The first run with each block's times the fastest of all runs."""

    def fit(i: int, field: str) -> Affine:
        return Affine.fit(SIZES, [min(getattr(r.blocks[i], field)(u) for r in runs) for u in SIZES])

    fields = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
    blocks = tuple(dataclasses.replace(b, **{f: fit(i, f) for f in fields}) for i, b in enumerate(runs[0].blocks))
    return dataclasses.replace(runs[0], blocks=blocks)


def main() -> None:
    torch.set_num_threads(1)
    os.environ["AUTOPIPE_CALIBRATION_DIR"] = tempfile.mkdtemp()  # the user's calibration stays as it is
    timing._time_once = _cpu_time_once  # type: ignore[assignment]
    devices._best_time = _cpu_best_time  # type: ignore[assignment]
    runs = [profile_model(load_model(GPT, {}), micro_batch_sizes=SIZES, warmup=2, repeat=5) for _ in range(3)]
    measured = _fastest(runs)
    cal = calibrate(measured, model=GPT)
    spec = cal.spec
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread")
    print(
        f"fitted: compute {spec.compute_efficiency:.3f}, memory {spec.memory_efficiency:.3f}, "
        f"overhead {spec.op_overhead_s * 1e6:.1f} us per op; median error {cal.median_error:.1%}, "
        f"max {cal.max_error:.1%}"
    )
    analytic = analytic_profile(load_model(GPT, {}, device="meta"), spec, micro_batch_sizes=SIZES)
    biggest = max(b.forward_s(8) for b in measured.blocks)
    print(f"{'block':<12} {'u':>2} {'forward ms':>22} {'backward ms':>22}")
    for a, m in zip(analytic.blocks, measured.blocks, strict=True):
        if m.forward_s(8) <= 0.1 * biggest:
            continue
        for u in SIZES:
            fwd = f"{a.forward_s(u) * 1e3:.2f} / {m.forward_s(u) * 1e3:.2f} ({a.forward_s(u) / m.forward_s(u):.2f}x)"
            bwd = (
                f"{a.backward_s(u) * 1e3:.2f} / {m.backward_s(u) * 1e3:.2f} ({a.backward_s(u) / m.backward_s(u):.2f}x)"
            )
            print(f"{a.name:<12} {u:>2} {fwd:>22} {bwd:>22}")
    print("(analytic / measured)")


if __name__ == "__main__":
    main()
