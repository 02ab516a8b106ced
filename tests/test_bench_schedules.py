"""bench/bench_schedules.py: its quick run prints a table that parses and agrees with itself,
and its deep transformer profiles (one layer repeated) equal counting the deep model."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "bench_schedules.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_schedules", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_schedules"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quick_run_prints_a_table_that_parses(capsys: pytest.CaptureFixture[str]) -> None:
    from autopipe.schedules import SPECS

    assert _bench().main(["--quick"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].startswith("machine: ")
    head = lines.index(next(line for line in lines if line.startswith("case ")))
    rows = []
    for line in lines[head + 1 :]:
        fields = line.split()
        if len(fields) != 12 or fields[0] != "mlp":
            break
        _, limit, gb, schedule, it, ratio, bubble, peak, m, v, _, best = fields
        rows.append(
            (
                limit,
                schedule,
                float(it),
                float(ratio),
                float(bubble.rstrip("%")),
                float(peak),
                float(gb),
                int(m),
                int(v),
                best,
            )
        )
    names = {s.name for s in SPECS}
    reasons = [line for line in lines if ": cannot plan: " in line]
    for limit in ("tight", "loose"):
        group = [r for r in rows if r[0] == limit]
        said = {line.split()[2].rstrip(":") for line in reasons if line.split()[1] == limit}
        assert {r[1] for r in group} | said == names  # every schedule: a row or a reason
        base = next(r[2] for r in group if r[1] == "1f1b")
        fastest = min(r[2] for r in group)
        for _, schedule, it, ratio, bubble, peak, gb, m, v, best in group:
            assert math.isclose(ratio, it / base, abs_tol=2e-3), schedule  # both printed rounded
            assert 0 <= bubble < 100 and 0 < peak <= gb + 1e-3 and m >= 1 and v >= 1
            assert (best == "*") == (it == fastest)
        winner = min(group, key=lambda r: r[2])[1]
        assert f"winner mlp {limit}: {winner} " in out.out
    assert any(line.startswith("V-shapes win in ") for line in lines)
    assert any(line.startswith("V-shapes lose in ") for line in lines)
