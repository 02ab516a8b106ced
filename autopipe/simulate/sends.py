"""The executor's cost of posting a send, charged to the actions that send to another rank.

The executor pays a fixed cost per action (``action_overhead_s``, in every stage time) and,
in an action that posts a send to another rank, a cost per send on top: copying the tensor out,
handing it to the transport, and the transport's threads taking the core from the compute
(``bench/bench_overhead.py``: on 2 CPU ranks over gloo, quiet, actions that send cost 0.44-0.90 ms
beyond their compute, those that do not 0.03-0.29 ms). Which actions send follows from the
schedule's placement alone (``home[j]``: the rank of virtual stage ``j``)::

    F of stage j sends its output       when j + 1 < n and home[j + 1] != home[j]
    B of stage j sends its input-gradient when j > 0     and home[j - 1] != home[j]
    W sends nothing

so in 1F1B on 2 ranks stage 0's F and stage 1's B send, stage 0's B and stage 1's F do not; in
interleaved 1F1B every F but the last stage's and every B but the first stage's send; in a V
placement (ZB-V, V-Half, DualPipeV) the turn of the V stays on one rank. A stage's F (or B) is
the same action for every micro-batch, so the cost goes into the stage's time per micro-batch
(:func:`with_send_cost`); the planner prices with it (``planner/pricing.py``), the plan's stage
times hold it, and the run report's split puts it under messages
(``runtime/run/breakdown.py``). Tests: tests/simulate/test_sends.py.
"""

from __future__ import annotations

from collections.abc import Sequence

from autopipe.errors import ScheduleError
from autopipe.simulate.events import StageCost

__all__ = ["SENDS_NONE", "Sends", "sends_of", "with_send_cost"]


Sends = tuple[tuple[bool, ...], tuple[bool, ...]]  # per virtual stage: (F sends, B sends)
SENDS_NONE: Sends = ((), ())


def sends_of(home: Sequence[int]) -> Sends:
    """Per virtual stage of placement ``home``: whether its F, and whether its B, posts a send
    to another rank (the module docstring's rule)."""
    n = len(home)
    forward = tuple(j + 1 < n and home[j + 1] != home[j] for j in range(n))
    backward = tuple(j > 0 and home[j - 1] != home[j] for j in range(n))
    return forward, backward


def with_send_cost(costs: Sequence[StageCost], home: Sequence[int], send_s: float) -> list[StageCost]:
    """``costs`` with ``send_s`` added to each F and each B (whole and input-gradient) that posts a
    send to another rank under placement ``home``; W unchanged. ``send_s`` 0: ``costs`` as they are."""
    if len(home) != len(costs):
        raise ScheduleError(f"home must give one rank per virtual stage ({len(costs)}), got {len(home)}")
    if not send_s:
        return list(costs)
    forward, backward = sends_of(home)
    out = []
    for c, f, b in zip(costs, forward, backward, strict=True):
        if not (f or b):
            out.append(c)  # frozen: the same cost
            continue
        up = send_s if b else 0.0
        # the constructor, not dataclasses.replace (2-3x its cost): the planner calls this for
        # every split it prices, a million stage costs in a 4-stage plan of models/resnet.py
        out.append(
            StageCost(
                c.forward_s + (send_s if f else 0.0),
                c.backward_s + up,
                c.backward_input_s + up,
                c.backward_weight_s,
                c.activation_bytes,
                c.weight_grad_bytes,
                c.transient_bytes,
                c.static_bytes,
            )
        )
    return out
