"""Repeated layers found, cut to a shallow copy, and the deep graph's node names predicted."""

from __future__ import annotations

from pathlib import Path

from autopipe.graph.shallow import Layers, deep_names, repeated_layers, shallow_copy
from autopipe.graph.trace import CREATED, fx_node_names, trace_model
from autopipe.model.load import load_model

GPT = str(Path(__file__).resolve().parents[2] / "models" / "gpt.py")
MOE = str(Path(__file__).resolve().parents[2] / "models" / "moe.py")


def _gpt(layers: int):  # type: ignore[no-untyped-def]
    return load_model(GPT, {"n_layer": layers}, device="meta")


def test_identical_layers_are_found_and_any_difference_refuses_them() -> None:
    model = _gpt(6).model
    assert repeated_layers(model) == Layers("blocks", 6)
    assert repeated_layers(_gpt(4).model) is None  # too few to gain from a shallow copy
    model.blocks[3].attn.n_head = 2  # a setting the forward reads
    assert repeated_layers(model) is None
    other = _gpt(6).model
    other.blocks[5].register_forward_hook(lambda m, a, out: out)
    assert repeated_layers(other) is None


def test_shallow_copy_shares_weights_and_leaves_the_model_whole() -> None:
    model = _gpt(6).model
    short = shallow_copy(model, Layers("blocks", 6))
    assert len(short.blocks) == 3 and len(model.blocks) == 6
    assert short.blocks[2] is model.blocks[2] and short.wte is model.wte


def test_deep_names_are_the_names_a_full_trace_gives() -> None:
    loaded = _gpt(7)
    short = shallow_copy(loaded.model, Layers("blocks", 7))
    traced = trace_model(short, loaded.make_inputs(2), micro_batch_size=2)
    created, survivors = traced.gm.meta[CREATED], [n.name for n in traced.gm.graph.nodes]
    names = deep_names(created, survivors, Layers("blocks", 7), fx_node_names(loaded.model, loaded.make_inputs(2)))
    full = trace_model(loaded.model, loaded.make_inputs(2), micro_batch_size=2)
    assert names is not None
    assert sorted(n for deep in names.values() for n in deep) == sorted(n.name for n in full.gm.graph.nodes)
    middle = traced.blocks[3].nodes  # blocks.1 stands for blocks.1 .. blocks.5
    assert [[names[n][k] for n in middle] for k in range(5)] == [list(full.blocks[3 + k].nodes) for k in range(5)]
    six = _gpt(6)  # a deep model that is not these layers repeated seven times: refused
    assert deep_names(created, survivors, Layers("blocks", 7), fx_node_names(six.model, six.make_inputs(2))) is None


def test_a_run_of_alike_layers_after_leading_ones() -> None:
    """DeepSeek-V3's shape: dense layers first, then MoE layers alike; the leading ones are kept whole."""
    model = load_model(MOE, {"n_layer": 8, "n_dense_layers": 2, "mtp_depth": 0}, device="meta").model
    layers = repeated_layers(model)
    assert layers == Layers("layers", 8, 2) and (layers.run, layers.kept) == (6, 5)
    assert [layers.source(j) for j in range(8)] == [0, 1, 2, 3, 3, 3, 3, 4]
    assert [layers.copies(s) for s in range(5)] == [range(0, 1), range(1, 2), range(2, 3), range(3, 7), range(7, 8)]
    short = shallow_copy(model, layers)
    assert len(short.layers) == 5 and short.layers[4] is model.layers[4]
    few = load_model(MOE, {"n_layer": 6, "n_dense_layers": 2, "mtp_depth": 0}, device="meta").model
    assert repeated_layers(few) is None  # a run of 4: too few
