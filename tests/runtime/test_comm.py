"""The in-memory transport matches receives by position, as NCCL does."""

from __future__ import annotations

import pytest
import torch

from autopipe.errors import CommunicationError
from autopipe.runtime.comm import ThreadHub

torch.set_num_threads(1)


def test_thread_comm_matches_receives_by_position_as_nccl_does() -> None:
    hub = ThreadHub(2, timeout_s=5)
    a, b = hub.comm(0), hub.comm(1)
    a.isend(torch.ones(1), 1, tag=7)
    a.isend(torch.zeros(1), 1, tag=8)
    out = torch.empty(1)
    with pytest.raises(CommunicationError, match="expected tag 8, the send has tag 7"):
        b.irecv(out, 0, tag=8).wait()  # posted first: it meets the first send, not tag 8
    b.irecv(out, 0, tag=8).wait()
    assert out.item() == 0.0
