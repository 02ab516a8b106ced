# Run: PYTHONPATH=. python bench/bench_schedules.py [--quick]   (repository root; ~1-2 min, --quick ~5 s)
"""Schedules side by side: the best plan of every schedule family, per model and memory limit.

For each case the planner is run once per registered schedule (``autopipe.schedules.SPECS``,
so a schedule added to the registry appears here by itself), with the schedule pinned and
everything else searched (cuts, micro-batches m, chunks per device v, recomputation). A
schedule that cannot plan a case (too few blocks for its chunks, m not a multiple of S, no
split that fits) prints the planner's one-line reason instead of a row.

Cases:
  * bundled models (models/gpt.py, llama.py, mlp.py at their default sizes), profiled on
    this machine's CPU with one thread, 4 devices, batch 32, the CPU link and per-action cost
    ``autopipe plan`` uses (solve/defaults.py);
  * synthetic GPT-style transformers of 32, 64 and 128 layers (widths 4096, 5120, 5120;
    sequence 2048; 6.7 B, 20 B and 40 B parameters) on 4, 8 and 16 catalogue H100s in bf16,
    batch 128. Their profiles are analytic (costs/analytic.py): built on meta and counted as a
    shallow copy of three layers whose count is repeated (``costs.deepen``: every layer of
    these models is the same, so this equals counting the deep model, without tracing it).

Memory limits: *loose* is 2 GiB per device for the bundled models and the H100's 80 GB for
the synthetic ones; *tight* is 1.1 x the smallest limit at which 1F1B plans at all (the
planner's own minimum, ``InfeasibleError.min_memory_bytes``, recomputation allowed), the
regime where a schedule's activation memory decides what fits. Columns: iteration time and
its ratio to 1F1B's under the same limit (< 1: faster), the simulated bubble, the largest
per-device peak memory, m, v and the stages recomputed. The summary at the end is computed
from the table: per case, whether the best V-shaped schedule (chunk j and 2S-1-j on device
j: ZB-V, V-Half, V-Min, DualPipeV) beats the best of the others.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from autopipe.costs.profile import Profile
from autopipe.errors import AutopipeError, InfeasibleError
from autopipe.planner.search import PlanRequest, plan_pipeline
from autopipe.schedules import SPECS
from autopipe.schedules.action import v_shape
from autopipe.schedules.spec import ScheduleSpec

ROOT = Path(__file__).resolve().parent.parent
TIGHT = 1.1  # the tight limit: this times the smallest limit 1F1B plans at


@dataclass(frozen=True)
class Case:
    name: str  # "gpt" or "gpt-32L"
    profile: Profile
    request: PlanRequest  # schedule and memory limit left for the bench to set
    loose: float  # bytes per device


@dataclass(frozen=True)
class Row:
    case: str
    limit: str  # "tight" | "loose"
    memory_bytes: float  # that limit, per device
    schedule: str
    iteration_s: float
    bubble: float
    peak_bytes: float
    micro_batches: int
    virtual: int
    recomputed: int


def is_v_shape(spec: ScheduleSpec) -> bool:
    """Whether ``spec`` places its chunks in a V (chunk j and 2S-1-j on device j)."""
    return spec.takes_virtual and spec.devices_of(4, 2) == tuple(v_shape(j, 4, 2) for j in range(8))


# --------------------------------------------------------------------------- profiles


# (name, model file, factory kwargs, devices)
BUNDLED = (
    ("gpt2", "gpt", {"preset": "gpt2"}, 4),
    ("llama-7b", "llama", {"preset": "llama2-7b"}, 4),
    ("mlp", "mlp", {}, 4),
    ("resnet", "resnet", {}, 4),
    ("unet", "unet", {}, 4),
)
SYNTHETIC = (  # GPT-style, sequence 2048: 6.7 B, 20 B and 40 B parameters
    ("gpt-32L", "gpt", {"preset": "gpt3-1.3b", "n_layer": 32, "n_embd": 4096, "n_head": 32}, 4),
    ("gpt-64L", "gpt", {"preset": "gpt3-1.3b", "n_layer": 64, "n_embd": 5120, "n_head": 40}, 8),
    ("gpt-128L", "gpt", {"preset": "gpt3-1.3b", "n_layer": 128, "n_embd": 5120, "n_head": 40}, 16),
)
QUICK = (("mlp", "mlp", {}, 2),)
BATCH, DEVICE = 128, "h100"


def analytic_cases(shapes: tuple[tuple[str, str, dict[str, object], int], ...]) -> Iterator[Case]:
    """Each model built on meta, counted (a model of identical layers as a shallow copy of
    three, exactly: ``costs.deepen``), priced on the catalogue's H100 in bf16; planned with the
    H100's NVLink and memory."""
    from autopipe.costs.analytic import analytic_profile, state_factor
    from autopipe.costs.devices import device_spec
    from autopipe.model.load import load_model

    spec = device_spec(DEVICE)
    for name, file, kwargs, devices in shapes:
        loaded = load_model(str(ROOT / "models" / f"{file}.py"), kwargs, device="meta")
        prof = analytic_profile(loaded, spec, micro_batch_sizes=(1, 2), dtype="bf16")
        req = PlanRequest(
            devices=devices,
            batch_size=BATCH,
            memory_limit=spec.memory_bytes,
            link_bandwidth=spec.nvlink_bandwidth,
            link_latency_s=spec.link_latency_s,
            state_factor=state_factor(prof),
        )
        yield Case(name, prof, req, spec.memory_bytes)


# --------------------------------------------------------------------------- planning


def tight_limit(case: Case) -> float:
    """TIGHT x the smallest per-device limit 1F1B plans at (the planner's own minimum)."""
    try:
        plan_pipeline(case.profile, replace(case.request, schedule="1f1b", memory_limit=1.0))
    except InfeasibleError as e:
        if e.min_memory_bytes is not None:
            return TIGHT * e.min_memory_bytes
    raise SystemExit(f"{case.name}: 1F1B fits 1 byte per device or never fits; no tight limit")


def best_per_schedule(case: Case, limit: str, memory: float, say: Callable[[str], None]) -> list[Row]:
    rows = []
    for spec in SPECS:
        req = replace(case.request, schedule=spec.name, memory_limit=memory)
        try:
            plan = plan_pipeline(case.profile, req)
        except AutopipeError as e:  # the schedule cannot plan this case: say why, in one line
            say(f"  {case.name} {limit} {spec.name}: cannot plan: {e}")
            continue
        rows.append(
            Row(
                case.name,
                limit,
                memory,
                spec.name,
                plan.iteration_time_s,
                plan.bubble_fraction,
                max(plan.peak_memory_bytes),
                plan.micro_batches,
                plan.virtual,
                sum(s.recompute for s in plan.stages),
            )
        )
    return rows


def table(rows: list[Row]) -> list[str]:
    """The table, one line per row: whitespace-separated fields, no spaces inside a field."""
    out = [
        f"{'case':9} {'limit':5} {'GB':>7} {'schedule':16} {'iter_ms':>10} {'vs_1f1b':>7} {'bubble':>7} "
        f"{'peak_GB':>8} {'m':>4} {'v':>2} {'recomp':>6} {'best':>4}"
    ]
    for key in dict.fromkeys((r.case, r.limit) for r in rows):
        group = [r for r in rows if (r.case, r.limit) == key]
        base = _base(group)
        fastest = min(r.iteration_s for r in group)
        for r in group:
            out.append(
                f"{r.case:9} {r.limit:5} {r.memory_bytes / 1e9:>7.3f} {r.schedule:16} {r.iteration_s * 1e3:>10.3f} "
                f"{r.iteration_s / base:>7.3f} {r.bubble * 100:>6.1f}% {r.peak_bytes / 1e9:>8.3f} {r.micro_batches:>4} "
                f"{r.virtual:>2} {r.recomputed:>6} {'*' if r.iteration_s == fastest else '-':>4}"
            )
    return out


def summary(rows: list[Row]) -> list[str]:
    """Where V-shapes win and lose, from the rows: per case, the best V-shaped schedule
    against the best other one."""
    v_names = {s.name for s in SPECS if is_v_shape(s)}
    wins, losses, out = [], [], []
    for key in dict.fromkeys((r.case, r.limit) for r in rows):
        group = [r for r in rows if (r.case, r.limit) == key]
        vs = [r for r in group if r.schedule in v_names]
        others = [r for r in group if r.schedule not in v_names]
        winner = min(group, key=lambda r: r.iteration_s)
        out.append(f"winner {key[0]} {key[1]}: {winner.schedule} ({winner.iteration_s / _base(group):.3f} x 1F1B)")
        if not vs or not others:
            continue
        bv, bo = min(vs, key=lambda r: r.iteration_s), min(others, key=lambda r: r.iteration_s)
        gap = bv.iteration_s / bo.iteration_s - 1
        (wins if gap < 0 else losses).append(f"{key[0]} {key[1]} ({bv.schedule} {gap:+.1%} vs {bo.schedule})")
    n = len(wins) + len(losses)
    out.append(f"V-shapes win in {len(wins)} of {n} cases: {'; '.join(wins) or 'none'}")
    out.append(f"V-shapes lose in {len(losses)} of {n} cases: {'; '.join(losses) or 'none'}")
    return out


def _base(group: list[Row]) -> float:
    return next((r.iteration_s for r in group if r.schedule == "1f1b"), float("nan"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="one tiny case (models/mlp.py on 2 devices): a smoke run")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {sys.version.split()[0]}, "
        f"torch {torch.__version__}; schedules: {', '.join(s.name for s in SPECS)}"
    )
    cases = analytic_cases(QUICK if args.quick else BUNDLED + SYNTHETIC)
    rows: list[Row] = []
    notes: list[str] = []
    for case in cases:
        for limit, memory in (("tight", tight_limit(case)), ("loose", case.loose)):
            rows += best_per_schedule(case, limit, memory, notes.append)
    print("\n".join(table(rows)))
    print("\n".join(notes))
    print("\n".join(summary(rows)))
    print(f"wall: {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
