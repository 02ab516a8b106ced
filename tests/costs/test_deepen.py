"""A deep model counted as a shallow copy of three layers prices exactly as counted in full."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autopipe.costs.analytic import count_model, profile_from_counts
from autopipe.costs.devices import device_spec
from autopipe.costs.profile import Profile
from autopipe.model.load import load_model

ROOT = Path(__file__).resolve().parents[2]
GPT, LLAMA, MLP, MOE = (str(ROOT / "models" / f"{m}.py") for m in ("gpt", "llama", "mlp", "moe"))

SKIPS = """
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Model(nn.Module):  # identical layers, but every layer reads the first one's output
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.layers = nn.ModuleList(Layer() for _ in range(6))

    def forward(self, x):
        first = self.layers[0](self.inp(x))
        h = first
        for layer in self.layers[1:]:
            h = layer(h) + first
        return h


def build_model():
    return Model()


def example_inputs(batch_size):
    return torch.randn(batch_size, 8)
"""


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _both(path: str, kwargs: dict[str, object], sizes: tuple[int, ...]) -> tuple[Profile, Profile, bool]:
    spec = device_spec("h100")
    full = profile_from_counts(
        count_model(load_model(path, kwargs, device="meta"), micro_batch_sizes=sizes, dtype="bf16"), spec
    )
    counts = count_model(load_model(path, kwargs, device="meta"), micro_batch_sizes=sizes, dtype="bf16", shallow=True)
    return full, profile_from_counts(counts, spec), counts.repeat is not None


@pytest.mark.slow
def test_gpt_counted_shallow_equals_the_full_count() -> None:
    full, shallow, repeated = _both(GPT, {"n_layer": 6}, (1, 2))
    assert repeated  # traced with 3 layers, not 6
    assert shallow == full  # every block, tensor, node name, shared parameter and the fingerprint
    assert [b.name for b in shallow.blocks][2:8] == [f"blocks.{i}" for i in range(6)]


def test_llama_counted_shallow_equals_the_full_count() -> None:
    full, shallow, repeated = _both(LLAMA, {"n_layer": 5}, (2,))
    assert repeated and shallow == full


def test_a_moe_with_leading_dense_layers_counted_shallow_equals_the_full_count() -> None:
    """DeepSeek-V3's shape: 2 dense layers kept whole, 5 MoE layers traced as 3; expert
    parallelism priced on either count gives one profile."""
    from autopipe.costs.options import Layout, Links, parallel_options

    kwargs = {"n_layer": 7, "n_dense_layers": 2, "block_size": 16}
    full, shallow, repeated = _both(MOE, kwargs, (2,))
    assert repeated and shallow == full
    spec, links = device_spec("h100"), Links(8, 450e9, 50e9)
    counts = [
        count_model(load_model(MOE, kwargs, device="meta"), micro_batch_sizes=(2,), dtype="bf16", shallow=deep)
        for deep in (False, True)
    ]
    full_ep, shallow_ep = (parallel_options(c, spec, links).price(Layout(ep=4)) for c in counts)
    assert shallow_ep == full_ep and sum(b.expert_params for b in full_ep.blocks) > 0


EXPORT = SKIPS.replace(
    "return torch.relu(self.fc(x))",
    "return torch.relu(self.fc(x)) / max(1, x.size(0))",  # fx cannot trace max(1, proxy)
).replace("h = layer(h) + first", "h = layer(h)")  # a chain of alike layers, traced by torch.export


@pytest.mark.parametrize("case", ["mlp", "skips", pytest.param("export", marks=pytest.mark.slow)])
def test_layers_that_differ_or_do_not_chain_are_counted_in_full(case: str, tmp_path: Path) -> None:
    path = MLP
    if case != "mlp":  # alike layers, but the first one's output goes to all, or no fx trace: no repeat
        path = str(tmp_path / f"{case}.py")
        Path(path).write_text(SKIPS if case == "skips" else EXPORT)
    full, shallow, repeated = _both(path, {}, (2,))
    assert not repeated and shallow == full
