"""Argument helpers: default micro-batch sizes, lists of integers and names."""

from __future__ import annotations

import pytest
import torch
from autopipe.cli.args import int_list, split_names

from autopipe.planner.defaults import default_micro_batch_sizes

torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("batch", "sizes"), [(1, (1,)), (2, (1, 2)), (3, (1, 3)), (6, (1, 3, 6)), (8, (2, 4, 8)), (64, (16, 32, 64))]
)
def test_default_micro_batch_sizes(batch: int, sizes: tuple[int, ...]) -> None:
    assert default_micro_batch_sizes(batch) == sizes


def test_arg_helpers() -> None:
    assert int_list(" 4,1,2,2 ", "--x") == (1, 2, 4)
    assert split_names(["A,B", "C", " ,"]) == ("A", "B", "C")
    assert split_names(None) == ()
