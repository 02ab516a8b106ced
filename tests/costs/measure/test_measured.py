"""The measured profiler: fitting costs over micro-batch sizes, threads, export traces."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from autopipe.costs.measure.measured import profile_model
from autopipe.costs.profile import Profile
from autopipe.errors import ProfileError
from autopipe.model.load import LoadedModel, ModelSpec, default_loss, load_model
from tests.helpers import Net


@pytest.mark.slow
@pytest.mark.usefixtures("transformers")
def test_an_export_profile_leaves_a_micro_batch_of_one_out(tmp_path: Path) -> None:
    """torch.export specialises size-1 dimensions, so the profile keeps the sizes that share a
    graph (2 and 4 here) and the executor's trace at the plan's size matches it."""
    from autopipe.costs.measure.measured import profile_model
    from autopipe.model.load import load_model
    from autopipe.planner.search import PlanRequest, plan_pipeline
    from autopipe.runtime import RunOptions, run_threads

    loaded = load_model("tests/fixtures/hf_gpt2.py", {})
    prof = profile_model(loaded, micro_batch_sizes=[1, 2, 4], warmup=0, repeat=1)
    assert prof.recipe.tracer == "export" and prof.micro_batch_sizes == (2, 4)
    plan = plan_pipeline(prof, PlanRequest(devices=2, batch_size=8, memory_limit=2.0**30))
    assert plan.micro_batch_size >= 2
    assert len(run_threads(plan, RunOptions(steps=1))) == 2  # re-traced at its size: same graph


def _loaded(model: nn.Module, seq: int = 64, vocab: int = 512) -> LoadedModel:
    return LoadedModel(
        spec=ModelSpec(Path("net.py")),
        model=model,
        make_inputs=lambda u: torch.randint(0, vocab, (u, seq), generator=torch.Generator().manual_seed(u)),
        make_targets=None,
        loss_fn=default_loss,
        has_targets=False,
    )


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_profile_fits_costs_over_micro_batch_sizes_and_round_trips(tmp_path: Path) -> None:
    torch.manual_seed(0)
    loaded = _loaded(Net(d=64, n=2))
    seen: list[tuple[int, int]] = []
    prof = profile_model(
        loaded, micro_batch_sizes=[1, 2, 4], warmup=1, repeat=3, progress=lambda _d, i, n: seen.append((i, n))
    )
    assert [b.name for b in prof.blocks] == ["embed", "layers.0", "layers.1", "head"]
    assert prof.micro_batch_sizes == (1, 2, 4) and prof.method == "measured"
    assert seen[-1] == (12, 12)
    layer = prof.blocks[1]
    assert layer.params == sum(p.numel() for p in loaded.model.layers[0].parameters())
    assert layer.param_bytes == 4 * layer.params
    # Activation bytes are exactly linear in the micro-batch size here.
    assert layer.saved_bytes(4) == pytest.approx(4 * layer.saved_bytes(1), rel=1e-6)
    assert all(b.forward_s(4) > 0 for b in prof.blocks[1:])
    # Error bars: each block's spread (>= 0, finite, one per kind of work) and the load before and after.
    assert all(0 <= v < math.inf for b in prof.blocks for v in vars(b.spread).values())
    assert prof.spread > 0  # three rounds of a real clock never agree to the nanosecond
    assert len(prof.load_average) == 2 and all(x >= 0 for x in prof.load_average)
    # The tensors between blocks: the input ids (from the model input), then a chain.
    assert [(t.src, t.dsts) for t in prof.tensors] == [(-1, (0,)), (0, (1,)), (1, (2,)), (2, (3,))]
    assert prof.tensors[1].bytes(2) == 2 * 64 * 64 * 4
    path = tmp_path / "profile.json"
    prof.save(path)
    assert Profile.load(path) == prof
    assert Profile.load(path).to_json() == prof.to_json()


def test_profile_errors() -> None:
    loaded = _loaded(Net(d=16, n=1))
    with pytest.raises(ProfileError, match=r"micro-batch sizes must be positive integers \(got \[0, 2\]\)"):
        profile_model(loaded, micro_batch_sizes=[0, 2])
    if not torch.cuda.is_available():
        with pytest.raises(ProfileError, match="no CUDA device is visible; use --device cpu"):
            profile_model(loaded, micro_batch_sizes=[1], device="cuda")


def test_profiling_uses_the_asked_threads_and_restores_them() -> None:
    loaded = _loaded(Net(d=16, n=1))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: list[int] = []
    original = loaded.make_inputs

    def spy(u: int) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return original(u)

    loaded = LoadedModel(loaded.spec, loaded.model, spy, None, default_loss, False)
    try:
        profile_model(loaded, micro_batch_sizes=[1], warmup=0, repeat=1, threads=1)
        assert seen == [1]
        assert torch.get_num_threads() == 2
        for kwargs, message in [
            ({"threads": 0}, "threads must be from 1 to 1024 (got 0)"),
            ({"threads": 100_000}, "threads must be from 1 to 1024 (got 100000)"),
            ({"warmup": 10**11}, "warmup must be from 0 to 1000 (got 100000000000)"),
            ({"repeat": 1.5}, "repeat must be an integer from 1 to 1000 (got 1.5)"),
            ({"repeat": True}, "repeat must be an integer from 1 to 1000 (got True)"),
        ]:
            with pytest.raises(ProfileError) as info:
                profile_model(loaded, micro_batch_sizes=[1], **kwargs)  # type: ignore[arg-type]
            assert str(info.value) == message
    finally:
        torch.set_num_threads(before)


def test_a_measured_profile_prices_a_layers_parts_from_its_counts() -> None:
    """Selective recomputation needs the counts: a measured layer's options keep the bytes its
    anatomy counts (the same saved_tensors_hooks storages as measured) and take a recomputed
    part's time as its counted ops' share of the layer's measured forward."""
    from autopipe.costs.activations.choices import MemoryChoice, apply

    loaded = load_model("models/gpt.py", {"n_layer": 2})
    prof = profile_model(loaded, micro_batch_sizes=[2, 4], warmup=0, repeat=1)
    layers = [b for b in prof.blocks if b.layer]
    assert [b.name for b in layers] == ["blocks.0", "blocks.1"] and not any(
        b.memory for b in prof.blocks if not b.layer
    )
    for b in layers:
        mlp = next(o for o in b.memory if o.recompute == ("mlp",))
        for u in (2, 4):
            # GELU's input and output (4 h each per token, fp32) no longer kept: 2 x 4 x 128 x 64 x u x 4 bytes
            assert b.saved_bytes(u) - mlp.saved_bytes(u) == pytest.approx(2 * 4 * 128 * 64 * u * 4)
            assert 0 < mlp.recompute_s(u) < b.forward_s(u)
    again = apply(prof, MemoryChoice(recompute=("mlp",)))
    b = again.blocks[prof.blocks.index(layers[0])]
    mlp = next(o for o in layers[0].memory if o.recompute == ("mlp",))
    assert b.backward_s(4) == pytest.approx(layers[0].backward_s(4) + mlp.recompute_s(4))
