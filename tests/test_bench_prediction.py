"""bench/bench_prediction.py on a small GPT: two real gloo runs, and a report whose counts are
the schedules' own (actions, messages between the ranks) and whose figures parse."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "bench_prediction.py"
M = 8  # the script's micro-batches; 2 ranks


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_small_run_reports_measured_against_predicted_per_schedule() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "-k", "n_layer=2", "--steps", "2", "--repeat", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=230,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {}
    for line in out.stdout.splitlines():
        fields = line.split()
        if fields and fields[0] in ("1f1b/v1", "interleaved-1f1b/v2"):
            rows.setdefault(fields[0], fields)  # the first table: the split below repeats the names
    assert set(rows) == {"1f1b/v1", "interleaved-1f1b/v2"}, out.stdout
    shared = re.search(r"^host sharing priced: compute x([0-9.]+) for 2 ranks", out.stdout, re.M)
    assert shared is not None, out.stdout
    sharing = float(shared[1])  # the ranks sharing this host, as measured beside the profile
    assert sharing >= 1.0
    pattern = r"^executor priced: ([0-9.]+) ms per action, ([0-9.]+) ms per send on top .*the profile's probe"
    priced = re.search(pattern, out.stdout, re.M)
    assert priced is not None, out.stdout  # measured beside the profile, as autopipe plan prices it
    for name, chunks in (("1f1b/v1", 2), ("interleaved-1f1b/v2", 4)):
        predicted, measured, error = float(rows[name][1]), float(rows[name][2]), rows[name][3]
        assert predicted > 0 and measured > 0
        assert abs(float(error.rstrip("%")) - (measured / predicted - 1) * 100) < 0.1
        assert int(rows[name][7]) == 2 * chunks * M  # every F and B of every chunk
        assert int(rows[name][8]) == 2 * (chunks - 1) * M  # every boundary crosses the ranks
        assert float(rows[name][14]) == float(priced[1]) and float(rows[name][15]) == float(priced[2])
        late = re.search(rf"^{re.escape(name)}: ([0-9.]+) of (\d+) messages", out.stdout, re.M)
        assert late is not None and 0 <= float(late[1]) <= int(late[2]) == 2 * (chunks - 1) * M
    assert out.stdout.startswith("machine: ")
