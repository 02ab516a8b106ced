"""Message routing between stages: a tag per message, skips straight to their reader."""

from __future__ import annotations

import torch

from autopipe.runtime import rebuild
from autopipe.runtime.routing import BACKWARD, FORWARD, make_routing
from autopipe.stages.split import split_model
from tests.runtime.helpers import cached_plan

torch.set_num_threads(1)


def test_routing_gives_every_message_its_own_tag() -> None:
    plan = cached_plan("skip", 2, "interleaved-1f1b", 2)
    split = split_model(rebuild(plan).traced, plan)
    routing = make_routing(split, 2, plan.micro_batches)
    tags = [
        routing.tag(p, v, r, i, d, s)
        for (p, v, r) in routing.edges
        for i in range(plan.micro_batches)
        for d in (FORWARD, BACKWARD)
        for s in (0, 1)
    ]
    assert len(tags) == len(set(tags))
    # the first encoder output skips straight to the decoder stage that reads it
    down0 = split.stages[0].outputs
    assert any(r >= 2 for (p, v, r) in routing.edges if p == 0 and v in down0)
