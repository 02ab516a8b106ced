"""Zero-bubble schedules on torch.distributed.pipelining for Hugging Face models (issue 27).

    python bench/bench_zero_bubble_torch.py [--archs a,b] [--schedules zb-h1,zb-v,dualpipe-v] [--ways export,engine]

Every architecture of tests/fixtures/hf_zoo.py (small configs, random weights) planned for 2
ranks and trained 3 SGD steps through ``to_torch_pipelining`` under ZB-H1, ZB-V and DualPipeV
(4 micro-batches of 2; one pair of gloo ranks runs every case) -- and through
``autopipe.pipeline(engine="torch")``, what ``autopipe run --engine torch`` runs -- each compared with one-process
training: the largest relative loss difference and absolute weight difference, or torch's
refusal. The table it prints is in docs/outlets.md. The test suite runs a subset
(tests/stages/test_zero_bubble_export.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.hf_zoo import ARCHS
from tests.stages.zb_worker import Case, check_cases


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--schedules", default="zb-h1,zb-v,dualpipe-v")
    p.add_argument("--ways", default="export,engine", help="to_torch_pipelining (export), pipeline(engine='torch')")
    args = p.parse_args()
    ways = args.ways.split(",")
    cases = [
        Case(a, s, engine=way == "engine")
        for a in args.archs.split(",")
        for s in args.schedules.split(",")
        for way in ways
    ]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zb-bench-") as folder:
        outcomes = check_cases(cases, Path(folder), timeout=3600)
    print("| arch | schedule | way | max loss rel. diff | max weight diff | ranks' s |")
    print("|---|---|---|---|---|---|")
    for o in outcomes:
        way = "engine" if o.case.engine else "export"
        if o.refused:
            print(f"| {o.case.arch} | {o.case.schedule} | {way} | refused: {o.refused} | | |")
        else:
            print(
                f"| {o.case.arch} | {o.case.schedule} | {way} | {o.loss_rel:.1e} | {o.weight_diff:.1e} "
                f"| {o.seconds:.1f} |"
            )
    print(f"\n{len(cases)} cases in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
