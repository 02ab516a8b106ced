"""bench/bench_schedules.py: its quick run prints a table that parses and agrees with itself,
and its deep transformer profiles (one layer repeated) equal counting the deep model."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from autopipe.costs.profile import Profile

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
        rows.append((limit, schedule, float(it), float(ratio), float(bubble.rstrip("%")), float(peak), float(gb), int(m), int(v), best))
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


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_repeated_layer_equals_counting_the_deep_model() -> None:
    from autopipe.costs.analytic import analytic_profile
    from autopipe.costs.devices import device_spec
    from autopipe.model.load import load_model

    bench, spec = _bench(), device_spec("h100")

    def count(layers: int) -> Profile:
        kwargs = {"n_layer": layers, "n_embd": 64, "n_head": 4, "block_size": 32, "vocab_size": 128}
        loaded = load_model(str(ROOT / "models" / "gpt.py"), kwargs, device="meta")
        return analytic_profile(loaded, spec, micro_batch_sizes=(1, 2), dtype="bf16")

    deep, made = count(3), bench.deepen(count(2), 3)
    assert [b.name for b in made.blocks] == [b.name for b in deep.blocks]
    for a, b in zip(made.blocks, deep.blocks, strict=True):
        assert (a.params, a.param_bytes, a.shared_param_bytes) == (b.params, b.param_bytes, b.shared_param_bytes)
        for field in ("forward_s", "backward_s", "backward_input_s", "backward_weight_s", "saved_bytes"):
            x, y = getattr(a, field), getattr(b, field)
            assert math.isclose(x.intercept, y.intercept, rel_tol=1e-9, abs_tol=1e-15), (a.name, field)
            assert math.isclose(x.slope, y.slope, rel_tol=1e-9, abs_tol=1e-15), (a.name, field)
    assert [(t.src, t.dsts, t.bytes) for t in made.tensors] == [(t.src, t.dsts, t.bytes) for t in deep.tensors]
    assert made.shared_params == deep.shared_params
