"""Which part of a layer each node is (``graph/units.py``): the bundled GPT and Llama (fx) and
Hugging Face decoders (torch.export), and the blocks that are no layer."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from autopipe.graph.kinds import OFFLOAD_KINDS, RECOMPUTE_KINDS, UNITS
from autopipe.graph.trace import trace_model
from autopipe.graph.units import node_units
from autopipe.model.load import load_model

ROOT = Path(__file__).resolve().parents[2]


def _units(spec: str, **kwargs: object) -> dict[str, Counter[str]]:
    loaded = load_model(spec, kwargs)
    traced = trace_model(loaded.model, loaded.make_inputs(2), micro_batch_size=2)
    units = node_units(traced.gm, loaded.model, [b.nodes for b in traced.blocks])
    return {b.name: Counter(units[n] for n in b.nodes if n in units) for b in traced.blocks}


def test_kinds_name_units() -> None:
    for table in (RECOMPUTE_KINDS, OFFLOAD_KINDS):
        assert all(u in UNITS for units in table.values() for u in units)


def test_gpt_layer_parts() -> None:
    found = _units(str(ROOT / "models" / "gpt.py"))
    assert found["wte"] == Counter() and found["lm_head"] == Counter()  # no attention: no layer
    # one node each: ln_1, c_attn, the fused attention, c_proj, ln_2, c_fc, GELU, c_proj, dropout; no latent attention
    assert found["blocks.1"] == Counter(dict.fromkeys((u for u in UNITS if u != "mla_up"), 1))


def test_llama_layer_parts() -> None:
    found = _units(str(ROOT / "models" / "llama.py"))["layers.2"]
    # each RMSNorm one fused node, q/k/v projections, SwiGLU: gate and up, the fused activation
    assert found == Counter(
        attn_norm=1, qkv_linear=3, core_attn=1, attn_proj=1, mlp_norm=1, mlp_fc1=2, mlp_act=1, mlp_fc2=1
    )


def test_latent_attention_up_projection() -> None:
    # models/moe.py's multi-head latent attention: the down-projections (wq_a, wkv_a) are the
    # qkv_linear, the latent norms no unit; from the normed latents on, the up-projections
    # (wq_b, wkv_b), the heads' split, the rotary embedding of q and of the shared key and the
    # concatenations are mla_up (Megatron-Core's mla_up_proj); grouped-query attention with q/k
    # norms (Qwen3) has no linear layer after its norms: no mla_up
    spec = str(ROOT / "models" / "moe.py")
    loaded = load_model(spec, {})
    traced = trace_model(loaded.model, loaded.make_inputs(2), micro_batch_size=2)
    units = node_units(traced.gm, loaded.model, [b.nodes for b in traced.blocks])
    up = [n for n in traced.blocks[1].nodes if units.get(n) == "mla_up"]
    assert {"layers_0_attn_wq_b", "layers_0_attn_wkv_b", "cat_2", "cat_3"} <= set(up)
    assert [n for n in traced.blocks[1].nodes if units.get(n) == "qkv_linear"] == [
        "layers_0_attn_wq_a",
        "layers_0_attn_wkv_a",
    ]
    assert not any("norm" in n for n in up)
    gqa = _units(spec, attention="gqa", n_kv_head=2, qk_norm=True)["layers.0"]
    assert gqa["mla_up"] == 0 and gqa["qkv_linear"] == 3


@pytest.mark.parametrize(
    "arch", ["llama", pytest.param("gpt2", marks=pytest.mark.slow), pytest.param("phi3", marks=pytest.mark.slow)]
)
def test_hugging_face_decoders(arch: str) -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    found = _units(str(ROOT / "tests" / "fixtures" / "hf_zoo.py"), arch=arch)
    layers = [name for name in found if found[name]]
    assert len(layers) == 2  # the two decoder layers, nothing else
    parts = {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "mlp_fc1", "mlp_act", "mlp_fc2"}
    for name in layers:
        assert parts <= set(found[name]), (arch, name, found[name])


@pytest.mark.slow
def test_eager_attention_core_is_the_scores_path() -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    # BLOOM's attention is written out: baddbmm, softmax, (dropout,) bmm
    found = _units(str(ROOT / "tests" / "fixtures" / "hf_zoo.py"), arch="bloom")
    assert max(c["core_attn"] for c in found.values()) > 1


@pytest.mark.slow
def test_experts_get_no_mlp_units() -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    found = _units(str(ROOT / "tests" / "fixtures" / "hf_zoo.py"), arch="mixtral")
    layer = next(c for c in found.values() if c)
    assert layer["core_attn"] == 1 and layer["qkv_linear"] == 3
    assert not {"mlp_fc1", "mlp_act", "mlp_fc2"} & set(layer)  # routed by top-k: not one MLP


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
