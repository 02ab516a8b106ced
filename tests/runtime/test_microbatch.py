"""Cutting a batch into micro-batches along the batch dimension only."""

from __future__ import annotations

import torch

from autopipe.runtime.microbatch import split_batch, split_flat

torch.set_num_threads(1)


def test_micro_batches_cut_the_batch_dimension_only() -> None:
    x, mask = torch.arange(8.0).reshape(8, 1), torch.ones(3)
    mbs = split_flat([x, mask, 5], 8, 4)
    assert [mb[0].flatten().tolist() for mb in mbs] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(mb[1] is mask and mb[2] == 5 for mb in mbs)
    assert [t[0].tolist() for t in split_batch((torch.arange(4),), 4, 2)] == [[0, 1], [2, 3]]
