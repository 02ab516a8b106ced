"""The batches of a run: train_data iterated the same on every rank whatever the model draws,
cycled when it ends (said once); bad batches get one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autopipe.errors import ModelLoadError
from autopipe.model.load import load_model
from autopipe.runtime.run.data import BatchSource

BASE = """
import torch
def build_model():
    return torch.nn.Linear(3, 1)
def example_inputs(batch_size):
    return torch.ones(batch_size, 3)
"""


def _source(tmp_path: Path, body: str, batch_size: int = 4) -> tuple[BatchSource, list[str]]:
    path = tmp_path / "m.py"
    path.write_text(BASE + body)
    notes: list[str] = []
    return BatchSource(load_model(str(path)), batch_size, seed=3, note=notes.append), notes


SHUFFLED = """
from torch.utils.data import DataLoader, TensorDataset
def train_data(batch_size):
    x = torch.arange(12.0).repeat_interleave(3).view(12, 3)
    return DataLoader(TensorDataset(x, x[:, 0]), batch_size=batch_size, shuffle=True, drop_last=True)
"""


def test_train_data_is_the_same_whatever_the_global_rng_does_and_cycles(tmp_path: Path) -> None:
    a, notes = _source(tmp_path, SHUFFLED)
    b, _ = _source(tmp_path, SHUFFLED)
    assert a.kind == "train_data" and notes == [f"training on train_data() from {tmp_path / 'm.py'}"]
    got_a = []
    for k in range(7):
        got_a.append(a.batch(k)[1])
        torch.rand(5)  # the model (dropout) drawing between batches, on one rank only
    got_b = [b.batch(k)[1] for k in range(7)]
    assert all(torch.equal(x, y) for x, y in zip(got_a, got_b, strict=True))
    assert sorted(torch.cat(got_a[:3]).tolist()) == [float(i) for i in range(12)]  # one pass: every sample once
    assert not torch.equal(torch.cat(got_a[:3]), torch.cat(got_a[3:6]))  # reshuffled on the next pass
    assert notes[1:] == ["train_data() ended after 3 batches; starting it again (cycling)"]
    resumed, _ = _source(tmp_path, SHUFFLED)
    assert torch.equal(resumed.batch(5)[1], got_a[5])  # a resumed run skips ahead to its step


def test_without_train_data_each_step_seeds_example_inputs(tmp_path: Path) -> None:
    source, notes = _source(tmp_path, "")
    assert source.kind == "example_inputs" and notes == []
    x, y = source.batch(2)
    assert torch.equal(x, torch.ones(4, 3)) and y is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "def train_data(batch_size):\n    return [torch.ones(batch_size, 3)]",
            r"batch 0 of train_data\(\) in .*m\.py is a Tensor; yield \(inputs, targets\) pairs",
        ),
        (
            "def train_data(batch_size):\n    return [(torch.ones(3, 3), None)]",
            r"batch 0 of train_data\(\) in .*m\.py has 3 samples in its inputs, "
            r"the plan's batch size is 4; .*drop_last=True",
        ),
        ("def train_data(batch_size):\n    return []", r"train_data\(4\) in .*m\.py yielded no batches"),
        ("def train_data(batch_size):\n    return 5", r"train_data\(4\) in .*m\.py returned a int; return an iterable"),
        (
            "def train_data(batch_size):\n    raise OSError('no such corpus')",
            r"train_data\(4\) raised OSError: no such corpus",
        ),
    ],
)
def test_bad_train_data_gets_one_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        source, _ = _source(tmp_path, body)
        source.batch(0)
