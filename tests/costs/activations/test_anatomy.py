"""What a layer's parts save, and what recomputing or offloading them keeps (``costs/activations/anatomy.py``),
against bytes counted by hand for the bundled GPT layer.

The textbook count is Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", section 4.1): a layer saves ``34 s b h + 5 a s^2 b`` bytes in 16-bit
precision. With fused attention the ``5 a s^2 b`` term (scores, softmax, its dropout) is gone
(costs/tensor.py), and without dropout so are its two ``s b h`` masks: 32 s b h, plus what the
fused kernels keep besides (per token: two layer norms' mean and 1/std, fp32; per head: the
attention's log-sum-exp, fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autopipe.costs.activations.anatomy import Anatomy, anatomy_of
from autopipe.costs.analytic import _meta_inputs, count_model
from autopipe.costs.counting import count_block, leaf
from autopipe.costs.measure.timing import flat_inputs_of, storage_key
from autopipe.graph.segment import extract
from autopipe.graph.units import node_units
from autopipe.model.load import load_model

ROOT = Path(__file__).resolve().parents[3]
B, S, H, A = 2, 64, 128, 4  # micro-batch, sequence, width, heads of the tiny GPT
SBH = S * B * H  # elements of one (s, b, h) tensor; Korthikanti's "s b h" bytes count 2 bytes each


@pytest.fixture(scope="module")
def gpt_layer() -> tuple[Anatomy, int]:
    torch.set_num_threads(1)
    loaded = load_model(str(ROOT / "models" / "gpt.py"), {}, device="meta")
    counts = count_model(loaded, micro_batch_sizes=(B,), dtype="bf16")
    traced = counts.traces[0]
    units = node_units(traced.gm, loaded.model, [b.nodes for b in traced.blocks])
    exclude = {storage_key(p) for p in traced.gm.parameters()}
    inputs = _meta_inputs(loaded.make_inputs(B), torch.bfloat16)
    env = dict(zip(traced.input_names, flat_inputs_of(traced, inputs), strict=True))
    for block in traced.blocks:
        seg = extract(traced.gm, block.nodes)
        args = [env[n] for n in seg.inputs]
        count, outs = count_block(seg.module, args, exclude)
        env.update(zip(seg.outputs, outs, strict=True))
        if block.name == "blocks.1":
            return anatomy_of(seg.module, [leaf(a) for a in args], units, exclude), count.saved_bytes
    raise AssertionError("no blocks.1")


STATS = 2 * (2 * S * B * 4)  # two layer norms' mean and 1/std per token, fp32
LSE = B * A * S * 4  # the fused attention's log-sum-exp per head and token, fp32


def test_everything_saved_is_the_textbook_count(gpt_layer: tuple[Anatomy, int]) -> None:
    anatomy, counted = gpt_layer
    assert anatomy.saved() == counted == 2 * 16 * SBH + STATS + LSE  # 32 s b h bytes


def test_selective_recomputation_keeps(gpt_layer: tuple[Anatomy, int]) -> None:
    anatomy, _ = gpt_layer
    everything = anatomy.saved()
    # the attention core: q, k, v are its inputs, its output the projection's input: only the log-sum-exp goes
    assert anatomy.held(["core_attn"]) == everything - LSE
    # the norms, their output discarded: both outputs (2 s b h each) and their statistics; inputs kept
    assert anatomy.held(["layernorm"]) == everything - 2 * 2 * SBH - STATS
    # the MLP: GELU's input and output (8 s b h each); its input (the norm's output) is kept
    assert anatomy.held(["mlp"]) == everything - 2 * 8 * SBH
    # the activation, its output discarded: GELU's output (the second linear's input), 8 s b h
    assert anatomy.held(["mlp_act"]) == everything - 8 * SBH
    # all three: 2 s b h (layer input) + 6 (q, k, v) + 2 (attention output) + 2 (the residual sum) = 12 s b h
    assert anatomy.held(["core_attn", "layernorm", "mlp"]) == 2 * 6 * SBH


def test_recomputed_forward_is_the_kinds_ops(gpt_layer: tuple[Anatomy, int]) -> None:
    anatomy, _ = gpt_layer
    attention = 4 * B * A * S * S * (H // A)  # QK^T and AV: 2 x 2 b a s^2 d
    assert sum(op.flops for op in anatomy.recomputed(["core_attn"])) == attention
    mlp = 2 * 2 * (B * S) * H * 4 * H  # two GEMMs of (bs x h) by (h x 4h)
    assert sum(op.flops for op in anatomy.recomputed(["mlp"])) == mlp
    assert sum(op.flops for op in anatomy.recomputed(["layernorm", "mlp_act"])) == 0  # element-wise only


def test_offload_moves_the_modules_saved_inputs(gpt_layer: tuple[Anatomy, int]) -> None:
    anatomy, _ = gpt_layer
    assert anatomy.offloaded(["attn_norm"]) == 2 * SBH  # the layer's input
    assert anatomy.offloaded(["qkv_linear"]) == 2 * SBH  # the norm's output
    assert anatomy.offloaded(["core_attn"]) == 6 * SBH  # q, k, v
    assert anatomy.offloaded(["attn_proj"]) == 0  # its input is the attention's output, which the core saves too
    assert anatomy.offloaded(["core_attn", "attn_proj"]) == 8 * SBH
    assert anatomy.offloaded(["mlp_norm"]) == 2 * SBH


def test_latent_attention_up_projection_recomputed() -> None:
    # models/moe.py's tiny MLA (4 heads, q/k 32 + 16 rotary channels, values 32), bf16, 2 x 64 tokens:
    # recomputing mla_up_proj with its output discarded (Megatron-Core's CheckpointWithoutOutput)
    # frees what the attention core saved of the up-projections -- the queries and keys (4 x 48 each
    # per token) and the keys-and-values storage the values are a view of (4 x (32 + 32)) -- and keeps
    # the normed latents it starts from (the rotary embedding saves only its cos / sin tables); the
    # recomputed forward is the two up-projections' GEMMs, among the region's ops
    loaded = load_model(str(ROOT / "models" / "moe.py"), {}, device="meta")
    counts = count_model(loaded, micro_batch_sizes=(B,), dtype="bf16")
    names = [b.name for b in counts.traces[0].blocks]
    heads, qk, v = 4, 32 + 16, 32
    for name in ("layers.0", "layers.1"):  # the dense layer and a MoE layer
        a = counts.anatomies[0][names.index(name)]
        assert a is not None
        assert a.saved() - a.held(("mla_up_proj",)) == B * S * (heads * qk * 2 + heads * (32 + v)) * 2
        gemms = [op for op in a.recomputed(("mla_up_proj",)) if op.flops]
        assert sum(op.flops for op in gemms) == 2 * B * S * (64 * heads * qk + 32 * heads * (32 + v))
