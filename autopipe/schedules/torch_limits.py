"""What torch.distributed.pipelining's schedule classes refuse, known before any rank starts.

Each rule is the check the class's constructor makes (torch 2.13,
torch/distributed/pipelining/schedules.py), with ``S`` the pipeline ranks, ``m`` the
micro-batches and ``V`` the stages (chunks) in all:

- ``Schedule1F1B`` (``1f1b``): ``m >= V`` ("Number of microbatches must be greater than or
  equal to the number of stages");
- ``ScheduleInterleaved1F1B`` (``interleaved-1f1b``) and ``ScheduleInterleavedZeroBubble``
  (``zb-h1``): ``m`` a multiple of its rounds, ``max(1, m // S)`` (``m`` = 5 on 2 ranks is
  refused, 3 or 4 run);
- ``ScheduleZBVZeroBubble`` (``zb-v``) and ``ScheduleDualPipeV`` (``dualpipe-v``): two stages per
  rank; DualPipeV also ``m >= V``.

``ScheduleGPipe`` and the schedules run from a CSV (``zb-h2``, ``v-half``, ``v-min``, through
``_PipelineScheduleRuntime``) take any ``m``. :func:`torch_refusal` says, in one line, what the
class would refuse; ``to_torch_pipelining`` raises it as a PlanError before tracing and
``autopipe run --engine torch`` exits 2 with it before starting a rank; ``autopipe plan --target
torch`` searches only what these classes run.

The rules are checked against the classes themselves.

Tests: tests/stages/test_torch_limits.py.
"""

from __future__ import annotations

from collections.abc import Callable

from autopipe.schedules.registry import schedule_names, schedule_spec

__all__ = ["torch_refusal"]


def _flag(field: str, value: object) -> str:
    return f"--{field.replace('_', '-')} {value}"


def torch_refusal(
    schedule: str,
    devices: int,
    micro_batches: int,
    stages: int,
    instead: str = "run with --engine autopipe",
    said: Callable[[str, object], str] = _flag,
) -> str | None:
    """Why torch's class for ``schedule`` refuses ``micro_batches`` over ``stages`` stages on
    ``devices`` ranks (one line, with what to plan instead, or ``instead``); None where it runs them.
    ``said(field, value)`` names a plan field as the caller's user writes it (a flag by default)."""
    if schedule not in schedule_names():
        return None  # to_torch_pipelining names the schedules it knows
    cls = schedule_spec(schedule).torch_class
    m, per_rank = micro_batches, stages // max(devices, 1)
    need = None
    if cls in ("Schedule1F1B", "ScheduleDualPipeV") and m < stages:
        need = f"at least as many micro-batches as stages ({stages}), and the plan has {m}"
        fix = f"plan with {said('micro_batches', stages)} or more"
    elif cls in ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble") and m % max(1, m // devices):
        rounds = max(1, m // devices)
        need = f"micro-batches in whole rounds (a multiple of {rounds} for {m} on {devices} ranks)"
        fix = f"plan with {said('micro_batches', m - m % rounds)} or {devices * ((m + devices - 1) // devices)}"
    elif cls in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV") and (per_rank != 2 or stages != 2 * devices):
        need = f"exactly 2 stages per rank, and the plan has {stages} on {devices} ranks"
        fix = f"plan with {said('virtual', 2)}"
    if need is None:
        return None
    return f"torch's {cls} ({schedule}) needs {need}; {fix}, or {instead}"
