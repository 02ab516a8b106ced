"""models/chargpt.py: a character-level GPT learning the standard library's own source.

Loaded through autopipe's loader (``load_model``), as every command loads it: the file
imports ``gpt`` from beside itself, which only that loader's sys.path handling allows.
"""

from __future__ import annotations

import importlib.util
import math
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest
import torch
from autopipe.cli.main import main

from autopipe.model.load import load_model
from tests.helpers import MODELS

torch.set_num_threads(1)

FILE = str(MODELS / "chargpt.py")
SMALL = {"n_layer": 2, "n_embd": 64, "n_head": 4, "seq_len": 32}


@pytest.fixture(scope="module")
def m() -> ModuleType:
    """The model file as a module, its folder on sys.path while it imports (as the loader does)."""
    spec = importlib.util.spec_from_file_location("_chargpt_under_test", FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(MODELS))
        spec.loader.exec_module(module)
    return module


def test_the_text_is_the_standard_library_source_in_ascii(m: ModuleType) -> None:
    text = m.corpus(5000)
    first = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[0].read_bytes()[:5000]
    assert m.decode(text) == first.decode("ascii", errors="ignore")  # the first file, non-ASCII bytes dropped
    full = m.corpus()
    assert full.dtype == torch.uint8 and int(full.max()) < m.VOCAB and full.numel() > 900_000


def test_train_data_is_next_character_prediction_and_reproducible(m: ModuleType) -> None:
    data = m.train_data(4, seq_len=16, batches=3)
    first, again = list(data), list(data)
    assert len(first) == len(data) == 3
    for (x, y), (x2, y2) in zip(first, again, strict=True):
        assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(x, x2) and torch.equal(y, y2)
    other = next(iter(m.train_data(4, seq_len=16, seed=1)))
    assert not torch.equal(other[0], first[0][0])
    assert len(m.train_data(8, seq_len=64)) == m.corpus().numel() // (8 * 64)  # one pass: the text's length


def test_builds_and_makes_its_batches_on_meta() -> None:
    loaded = load_model(FILE, {"n_layer": 2}, device="meta")
    x, y = loaded.make_inputs(2), loaded.make_targets(2)  # type: ignore[misc]
    assert all(p.is_meta for p in loaded.model.parameters()) and x.is_meta and y.is_meta
    assert loaded.model.lm_head.weight.shape == (128, 128)


@pytest.mark.slow
def test_training_on_the_text_brings_the_loss_well_below_chance(m: ModuleType) -> None:
    torch.manual_seed(0)
    loaded = load_model(FILE, SMALL)  # the model as autopipe builds it
    model = loaded.model
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for x, y in m.train_data(16, seq_len=32, batches=200):
        loss = loaded.loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    chance = math.log(m.VOCAB)  # 4.85 nats: an untrained model knows nothing
    assert abs(losses[0] - chance) < 0.25
    assert sum(losses[-20:]) / 20 < 0.6 * chance, losses[::20]


@pytest.mark.slow
def test_plans_for_two_stages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "plan",
        FILE,
        "-k",
        "n_layer=2",
        "-k",
        "n_embd=32",
        "--stages",
        "2",
        "--batch-size",
        "8",
        "--memory",
        "1GiB",
        "--repeat",
        "1",
        "--warmup",
        "0",
        "--device",
        "cpu",
        "-o",
        str(tmp_path / "plan.json"),
    ]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "plan.json").is_file()
