"""autopipe/config/megatron.py: plans as Megatron-LM arguments, checked by Megatron's own rules.

:func:`megatron_rules` re-states, for the flags autopipe prints, the checks Megatron-LM runs on
them (megatron/training/arguments.py ``validate_args``; the uneven-split, layout and recompute
checks of megatron/core/transformer/transformer_config.py ``TransformerConfig.__post_init__``;
the layout grammar of megatron/core/transformer/pipeline_parallel_layer_layout.py) and returns
the layers of every (virtual) stage as Megatron builds them, to compare with the plan.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from pathlib import Path

import pytest
from test_torchtitan import _gpt_like, _sharded  # the same synthetic GPT plans

from autopipe.config.megatron import megatron_args, megatron_split
from autopipe.config.parts import Chunk, Parts, model_parts
from autopipe.errors import ConfigError
from autopipe.modes import Sharding
from autopipe.plans import Overlap, Plan


class MegatronRejects(AssertionError):
    """Megatron-LM would refuse these arguments."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False)
    for flag in (
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--micro-batch-size",
        "--global-batch-size",
        "--num-layers",
        "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank",
        "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers",
        "--recompute-num-layers",
        "--hidden-size",
        "--ffn-hidden-size",
        "--num-attention-heads",
        "--num-query-groups",
        "--seq-length",
        "--max-position-embeddings",
    ):
        p.add_argument(flag, type=int, default=None)
    p.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    p.add_argument(
        "--position-embedding-type", choices=("learned_absolute", "rope", "yarn", "mrope", "relative", "none")
    )
    for flag in (
        "--group-query-attention",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
    ):
        p.add_argument(flag, action="store_true")
    p.add_argument("--pipeline-model-parallel-layout", default=None)
    p.add_argument("--recompute-granularity", default=None)
    p.add_argument("--recompute-method", default=None)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--fp8-format", choices=("e4m3", "hybrid"), default=None)  # TransformerConfig.fp8's Literal
    p.add_argument("--use-distributed-optimizer", action="store_true")
    p.add_argument("--grad-reduce-in-bf16", action="store_true")  # arguments.py's mixed-precision group
    return p


def parse_layout(text: str) -> list[list[str]]:
    """Megatron's ``parse_str_to_list``: commas dropped, ``(..)*n`` and ``x*n`` unrolled, ``|``
    between stages, one letter per layer."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    stages = [list(stage) for stage in text.split("|")]
    bad = {ch for stage in stages for ch in stage} - set("ELtm")
    if bad:
        raise MegatronRejects(f"invalid layer characters {bad}")
    return stages


def _split_rules(lines: str, world_size: int) -> tuple[argparse.Namespace, list[int]]:
    """The arguments, and the layers of every virtual stage (checked as :func:`megatron_rules`)."""
    argv = [word for line in lines.splitlines() if not line.startswith("#") for word in shlex.split(line)]
    a = _parser().parse_args(argv)
    t, p, L = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.num_layers

    def check(ok: bool, why: str) -> None:
        if not ok:
            raise MegatronRejects(why)

    check(world_size % (t * p) == 0, "world size not divisible by t x p")
    d = world_size // (t * p)
    check(
        a.micro_batch_size > 0 and a.global_batch_size % (a.micro_batch_size * d) == 0,
        "global batch size not divisible by micro batch size x data parallel size",
    )
    vpp_flags = [
        a.num_layers_per_virtual_pipeline_stage,
        a.num_virtual_stages_per_pipeline_rank,
        a.pipeline_model_parallel_layout,
    ]
    check(sum(x is not None for x in vpp_flags) <= 1, "no more than one of the virtual pipeline flags and the layout")
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    if a.sequence_parallel:
        check(t > 1, "sequence parallel needs tensor parallel > 1")
    g, method = a.recompute_granularity, a.recompute_method
    if g is not None:
        check(g in ("full", "selective"), "recompute granularity must be full or selective")
        check(method in ("block", "uniform") if method is not None else g == "selective", "recompute method")
        check(
            a.recompute_num_layers is not None if g == "full" else a.recompute_num_layers is None,
            "recompute num layers",
        )
    if a.pipeline_model_parallel_layout is not None:
        check(first is None and last is None, "the layout cannot be set with other pipeline layout arguments")
        stages = parse_layout(a.pipeline_model_parallel_layout)
        check(len(stages) % p == 0, "layout length not divisible by pipeline size")
        flat = [x for s in stages for x in s]
        check(flat[:1] == ["E"] and flat[-1:] == ["L"], "layout must start with E and end with L")
        check(flat.count("E") == 1 and flat.count("L") == 1, "E and L exactly once")
        check(flat.count("t") == L, "decoder layers in the layout must match num_layers")
        return a, [s.count("t") for s in stages]
    if a.num_layers_per_virtual_pipeline_stage is not None:
        check(first is None and last is None, "use --num-virtual-stages-per-pipeline-rank with uneven stages")
        check(L % p == 0, "num layers divisible by pipeline size")
        check(
            (L // p) % a.num_layers_per_virtual_pipeline_stage == 0,
            "layers per stage divisible by layers per virtual stage",
        )
        vpp = (L // p) // a.num_layers_per_virtual_pipeline_stage
        return a, [a.num_layers_per_virtual_pipeline_stage] * (p * vpp)
    vpp = a.num_virtual_stages_per_pipeline_rank or 1
    if vpp > 1:
        check(p > 1, "interleaved schedule needs pipeline size > 1")
    if first is None and last is None:
        check(L % p == 0, "number of layers should be divisible by the pipeline-model-parallel size")
        return a, [L // p // vpp] * (p * vpp)
    totals: list[int | None] = [None] * p
    remaining, middle = L, p
    for rank, n in ((0, first), (p - 1, last)):
        if n is not None:
            check(n > 0, "first/last stage layers must be > 0")
            check(n % vpp == 0, "first/last stage layers divisible by the virtual pipeline degree")
            totals[rank] = n
            remaining -= n
            middle -= 1
    check(bool(remaining) == bool(middle), "middle layers remaining but no middle stages (or the reverse)")
    if middle:
        check(remaining % middle == 0, "middle layers divisible by the middle stages")
        check((remaining // middle) % vpp == 0, "middle layers per rank divisible by the virtual pipeline degree")
    per_rank = [n if n is not None else remaining // middle for n in totals]
    return a, [per_rank[j % p] // vpp for j in range(p * vpp)]


def layer_offsets(a: argparse.Namespace, counts: list[int]) -> list[int]:
    """Megatron-Core 0.19's ``get_transformer_layer_offset`` (megatron/core/transformer/transformer_layer.py)
    for the first/last-stage form, re-stated: the index of each virtual stage's first layer, in
    stage order. Like Megatron's it divides by the middle ranks, so p = 2 with both ends given and
    v > 1 raises ZeroDivisionError."""
    p, vpp = a.pipeline_model_parallel_size, a.num_virtual_stages_per_pipeline_rank
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    middle_stages = p - (first is not None) - (last is not None)
    middle_layers = a.num_layers - (first or 0) - (last or 0)
    offsets = []
    for j in range(len(counts)):
        rank, vp_stage = j % p, j // p
        middle_rank = rank if first is None else rank - 1
        if vpp is None:
            per_rank = middle_layers // middle_stages if middle_stages > 0 else 0
            offsets.append(0 if rank == 0 else middle_rank * per_rank + (first or 0))
            continue
        first_chunk, last_chunk, middle_chunk = (first or 0) // vpp, (last or 0) // vpp, middle_layers // vpp
        total = first_chunk + middle_chunk + last_chunk
        if rank == 0:
            offsets.append(vp_stage * total)
        else:
            offsets.append(vp_stage * total + first_chunk + middle_rank * (middle_chunk // middle_stages))
    return offsets


def recompute_pieces(lines: str, counts: list[int]) -> list[list[int]]:
    """Megatron's uniform recomputation (megatron/core/recompute.py): per stage, the layers of each
    checkpointed piece, groups of ``--recompute-num-layers`` clipped at the stage's last layer."""
    n = int(_flags(lines)["--recompute-num-layers"])
    return [[min(n, c - i) for i in range(0, c, n)] for c in counts]


def megatron_rules(lines: str, world_size: int, *, model: bool = False) -> list[int]:
    """Megatron's checks on the printed arguments; the transformer layers of each virtual stage
    in stage order (vpp rank major: stage j on pipeline rank j % p), as Megatron builds them.
    ``model``: the model's own arguments must be there too (``validate_args``' required ones)."""
    a, counts = _split_rules(lines, world_size)
    if a.recompute_granularity == "full" and a.recompute_num_layers < 1:
        raise MegatronRejects("recompute num layers must be >= 1")
    if model:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"):
            if getattr(a, name) is None:
                raise MegatronRejects(f"{name} argument is None")
    if a.decoder_first_pipeline_num_layers is not None or a.decoder_last_pipeline_num_layers is not None:
        starts = [sum(counts[:j]) for j in range(len(counts))]
        if layer_offsets(a, counts) != starts:
            raise MegatronRejects("Megatron's layer offsets differ from the stages' first layers")
    return counts


def _flags(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            words = shlex.split(line)
            out[words[0]] = words[1] if len(words) > 1 else ""
    return out


def _layers(plan: Plan) -> list[int]:
    return [c.layers for c in model_parts(plan).chunks]


def test_the_rules_refuse_what_megatron_refuses() -> None:
    ok = (
        "--tensor-model-parallel-size 1\n--pipeline-model-parallel-size 4\n--micro-batch-size 2\n"
        "--global-batch-size 16\n--num-layers 8\n"
    )
    assert megatron_rules(ok, 8) == [2, 2, 2, 2]
    bad = {
        (
            "--pipeline-model-parallel-layout 'Ett|tt|tt|ttL'\n--num-virtual-stages-per-pipeline-rank 1"
        ): "no more than one",
        "--pipeline-model-parallel-layout 'Ett|tt|tt|tL'": "must match num_layers",
        "--pipeline-model-parallel-layout 'tt|Ett|tt|ttL'": "start with E",
        "--pipeline-model-parallel-layout 'Ett|tt|tt|ttL'\n--decoder-first-pipeline-num-layers 2": "cannot be set",
        "--decoder-first-pipeline-num-layers 3\n--num-virtual-stages-per-pipeline-rank 2": "divisible by the virtual",
        "--decoder-first-pipeline-num-layers 1": "middle layers divisible",
        "--num-layers-per-virtual-pipeline-stage 3": "layers per stage divisible",
        "--recompute-granularity full": "recompute method",
        "--sequence-parallel": "tensor parallel > 1",
    }
    for extra, why in bad.items():
        with pytest.raises(MegatronRejects, match=why):
            megatron_rules(ok + extra + "\n", 8)
    with pytest.raises(MegatronRejects, match="global batch size"):
        megatron_rules(ok, 24)  # d = 6: 16 is not a multiple of 2 x 6


@pytest.mark.slow  # the gpt_plans fixture plans two models (once per session)
def test_an_uneven_plan_becomes_first_and_last_stage_layers(gpt_plans: dict[str, Path]) -> None:
    plan = Plan.load(gpt_plans["uneven"])
    text = megatron_args(plan)
    flags = _flags(text)
    assert megatron_rules(text, plan.devices * plan.data_parallel) == _layers(plan)
    assert flags["--pipeline-model-parallel-size"] == str(plan.devices) and flags["--tensor-model-parallel-size"] == "1"
    assert flags["--micro-batch-size"] == str(plan.micro_batch_size)
    assert flags["--global-batch-size"] == str(plan.batch_size * plan.data_parallel)
    assert flags["--num-layers"] == "6" and sum(_layers(plan)) == 6
    if len(set(_layers(plan))) > 1:  # the planner's cuts are uneven at the ends: 1/2/2/1
        assert "--decoder-first-pipeline-num-layers" in flags or "--pipeline-model-parallel-layout" in flags
    assert all(s.recompute for s in plan.stages)  # --recompute-all: one piece per stage
    group = max(_layers(plan))  # the largest stage's layers: every stage is one piece, as the plan prices it
    assert (flags["--recompute-granularity"], flags["--recompute-method"], flags["--recompute-num-layers"]) == (
        "full",
        "uniform",
        str(group),
    )
    assert recompute_pieces(text, megatron_rules(text, plan.devices)) == [[n] if n else [] for n in _layers(plan)]
    if plan.schedule not in ("1f1b", "interleaved-1f1b"):
        assert f"# Megatron has no {plan.schedule} schedule: it runs 1F1B" in text


@pytest.mark.slow  # the gpt_plans fixture plans two models (once per session)
def test_an_interleaved_3d_plan_with_tensor_parallelism(gpt_plans: dict[str, Path]) -> None:
    plan = Plan.load(gpt_plans["interleaved"])
    assert (plan.tensor_parallel, plan.virtual, plan.data_parallel) == (2, 2, 2) and plan.sequence_parallel
    text = megatron_args(plan, zero1=True)  # t and sequence parallelism from the plan
    flags = _flags(text)
    assert "--use-distributed-optimizer" in flags
    world = plan.tensor_parallel * plan.devices * plan.data_parallel
    assert megatron_rules(text, world) == _layers(plan)
    assert flags["--tensor-model-parallel-size"] == "2" and "--sequence-parallel" in flags
    assert f"= {world} GPUs" in text
    assert flags["--global-batch-size"] == str(plan.batch_size * plan.data_parallel)
    assert "--recompute-granularity" not in flags  # nothing recomputed
    # the same plan without t: Megatron turns sequence parallelism off, and says so
    text1 = megatron_args(plan, tensor_parallel=1, sequence_parallel=True)
    assert "--sequence-parallel" not in _flags(text1) and "# sequence parallelism needs tensor parallelism" in text1
    with pytest.raises(ConfigError, match="tensor parallel degree is 0"):
        megatron_args(plan, tensor_parallel=0)


def _parts(counts: list[int]) -> Parts:
    chunks = tuple(
        Chunk(index=i, rank=0, layers=n, pre=("wte",) if i == 0 else (), post=("head",) if i == len(counts) - 1 else ())
        for i, n in enumerate(counts)
    )
    return Parts(container="layers", num_layers=sum(counts), chunks=chunks, notes=(), round_robin=True)


@pytest.mark.parametrize(
    ("counts", "p", "form"),
    [
        ([3, 3, 3, 3], 4, None),  # even: sizes only
        ([2, 3], 1, None),  # no pipeline: one chunk per rank
        ([2, 2, 2, 2, 2, 2, 2, 2], 4, "--num-layers-per-virtual-pipeline-stage"),  # even, interleaved
        ([1, 2, 2, 1], 4, "--decoder-first-pipeline-num-layers"),  # uneven ends
        ([1, 3, 3, 1, 3, 3], 3, "--decoder-first-pipeline-num-layers"),  # uneven ends, interleaved
        ([2, 3], 2, "--decoder-first-pipeline-num-layers"),  # two stages, unequal: both given
        ([0, 2, 3, 2, 2, 1], 6, "--pipeline-model-parallel-layout"),  # anything else
        ([1, 2, 2, 2, 2, 2, 2, 3], 4, "--pipeline-model-parallel-layout"),
    ],
)
def test_every_split_form_passes_megatron_rules_with_the_same_layers(
    counts: list[int], p: int, form: str | None
) -> None:
    v = len(counts) // p
    split = megatron_split(_parts(counts), p, v)
    assert (split[0] if split else None) == form
    args = [
        "--tensor-model-parallel-size",
        "1",
        "--pipeline-model-parallel-size",
        str(p),
        "--micro-batch-size",
        "1",
        "--global-batch-size",
        str(p),
        "--num-layers",
        str(sum(counts)),
        *split,
    ]
    text = "\n".join(shlex.join(args[i : i + 2]) for i in range(0, len(args), 2))
    assert megatron_rules(text, p) == (counts if p > 1 else [sum(counts)])  # one rank: one chunk
    if form == "--decoder-first-pipeline-num-layers" and v > 1:
        assert split[-2:] == ["--num-virtual-stages-per-pipeline-rank", str(v)]


@pytest.mark.parametrize(
    ("counts", "p", "why"),
    [
        ([0, 1, 1, 4], 4, "pipeline rank(s) 0 hold no transformer layer"),  # the embedding alone first
        ([4, 0], 2, "pipeline rank(s) 1 hold no transformer layer"),  # the loss alone last (models/llama.py)
        ([3, 5, 3, 5], 2, "two pipeline ranks with interleaving"),
        ([1, 1, 1, 1, 1, 2, 2, 2], 4, "a rank's chunks differ in layers"),
        ([1, 2, 3, 2], 4, "the stages are uneven beyond the first and last"),
    ],
)
def test_the_layout_note_gives_the_reason_the_split_is_a_layout_string(counts: list[int], p: int, why: str) -> None:
    from autopipe.config.megatron import _layout_note
    from autopipe.config.parts import Degrees

    v = len(counts) // p
    parts = _parts(counts)
    assert megatron_split(parts, p, v)[0] == "--pipeline-model-parallel-layout"
    deg = Degrees(tensor=1, pipeline=p, data=1, virtual=v, sequence_parallel=False, selective_recompute=False)
    assert _layout_note(parts, deg).startswith(why)


def test_a_rotary_model_is_told_megatron_fuses_rope_with_transformer_engine() -> None:
    # megatron-core 0.19 and main: TransformerConfig raises "apply_rope_fusion is not available.
    # Please install TE >= 1.4." for --position-embedding-type rope without Transformer Engine
    # (tools/megatron_check.py found it on the models/llama.py plan)
    from autopipe.config.megatron import _definition
    from autopipe.config.model_facts import ModelFacts

    rope = [n for n in _definition(ModelFacts(position="rope"), "")[1] if n.startswith("rope: ")]
    assert rope and rope[0].endswith("add --no-rope-fusion") and "Transformer Engine >= 1.4" in rope[0]
    assert not [n for n in _definition(ModelFacts(position="learned_absolute"), "")[1] if n.startswith("rope: ")]


@pytest.mark.slow  # the gpt_plans fixture plans two models (once per session)
def test_a_plan_whose_stages_recompute_partly_and_a_gpipe_plan_get_notes(gpt_plans: dict[str, Path]) -> None:
    plan = Plan.load(gpt_plans["uneven"])
    partly = dataclasses.replace(
        plan, schedule="gpipe", stages=tuple(dataclasses.replace(s, recompute=s.index == 0) for s in plan.stages)
    )
    text = megatron_args(partly)
    assert "# the plan recomputes stage(s) 0 only; Megatron recomputes every stage, so stage(s) 1-3" in text
    assert "# Megatron has no gpipe schedule: it runs 1F1B with these stages instead" in text
    assert megatron_rules(text, plan.devices) == _layers(plan)


@pytest.mark.slow  # the gpt_plans fixture plans two models (once per session)
def test_a_v_shaped_plan_runs_round_robin_in_megatron_and_says_so(gpt_plans: dict[str, Path]) -> None:
    from autopipe.schedules.registry import schedule_spec

    plan = Plan.load(gpt_plans["interleaved"])
    spec = schedule_spec("zb-v")
    v_plan = dataclasses.replace(
        plan,
        schedule="zb-v",
        stages=tuple(
            dataclasses.replace(s, rank=spec.device_of(s.index, plan.devices, plan.virtual)) for s in plan.stages
        ),
    )
    text = megatron_args(v_plan)
    assert (
        "# Megatron has no zb-v schedule: it runs interleaved 1F1B with these stages instead "
        f"(no separate weight-gradient pass; chunk j on rank j % {plan.devices}, not in the plan's V)"
    ) in text
    assert megatron_rules(text, plan.devices * plan.data_parallel) == _layers(plan)


def test_long_layouts_are_compressed_and_unroll_to_the_same_stages() -> None:
    from autopipe.config.megatron import layout_string

    counts = [1] + [2] * 34 + [1] * 27 + [0, 0]
    text = layout_string(_parts(counts))
    assert text == "Et|(tt|)*34(t|)*27|L"
    assert [s.count("t") for s in parse_layout(text)] == counts
    assert layout_string(_parts([6, 0, 0, 0, 7])) == "Et*6|(|)*3t*7L"
    assert [s.count("t") for s in parse_layout("Et*6|(|)*3t*7L")] == [6, 0, 0, 0, 7]


def test_a_layout_names_the_models_mtp_layers_on_the_last_stage_before_the_loss() -> None:
    """Megatron asserts the layout holds ``--mtp-num-layers`` MTP layers ('m'), after every
    decoder layer and in one virtual stage (pipeline_parallel_layer_layout.py); a layout without
    them is refused (tools/megatron_check.py's control)."""
    from autopipe.config.megatron import layout_string, megatron_split

    assert layout_string(_parts([3, 2, 2, 0]), mtp=1) == "Ettt|tt|tt|mL"
    assert layout_string(_parts([3, 2, 2, 0])) == "Ettt|tt|tt|L"
    split = megatron_split(_parts([3, 2, 1, 2]), 4, 1, mtp=2)  # uneven in the middle: a layout
    assert split == ["--pipeline-model-parallel-layout", "Ettt|tt|t|ttmmL"]


@pytest.fixture(scope="module")
def coarse_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real analytic plan of a 24-layer models/gpt.py in 8 coarse blocks on 4 H100 stages, every
    stage recomputed: its last block is ``blocks.21..lm_head`` (layers 22 and 23 go unnamed)."""
    from autopipe.cli.main import main

    gpt = str(Path(__file__).resolve().parents[2] / "models" / "gpt.py")
    out = tmp_path_factory.mktemp("coarse") / "coarse.json"
    args = ["-k", "n_layer=24", "--blocks", "8", "--device", "h100", "--stages", "4", "--batch-size", "16"]
    assert main(["plan", gpt, *args, "--recompute-all", "-o", str(out)]) == 0
    return out


def _arguments(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


@pytest.mark.slow  # plans a 24-layer model and rebuilds it on the meta device
def test_coarse_blocks_count_the_models_layers_not_the_names(coarse_plan: Path) -> None:
    from autopipe.api import megatron_config

    plan = Plan.load(coarse_plan)
    assert plan.stages[-1].blocks[-1] == "blocks.21..lm_head"
    assert [c.layers for c in model_parts(plan).chunks] == [11, 6, 2, 3]  # by the names: 22 layers
    assert [c.layers for c in model_parts(plan, 24).chunks] == [11, 6, 2, 5]  # the merged block takes 21-23
    text = megatron_config(plan, base=coarse_plan.parent)
    assert _arguments(text) == [
        "--tensor-model-parallel-size 1",
        "--pipeline-model-parallel-size 4",
        "--micro-batch-size 16",
        "--global-batch-size 16",
        "--num-layers 24",
        "--hidden-size 128",
        "--ffn-hidden-size 512",
        "--num-attention-heads 4",
        "--seq-length 64",
        "--max-position-embeddings 64",
        "--normalization LayerNorm",
        "--position-embedding-type learned_absolute",
        "--bf16",  # the plan is counted in bf16 (its profile device says "(analytic, bf16)")
        "--pipeline-model-parallel-layout 'Et*11|t*6|tt|t*5L'",
        "--recompute-granularity full",
        "--recompute-method uniform",
        "--recompute-num-layers 11",
    ]
    assert megatron_rules(text, 4, model=True) == [11, 6, 2, 5]
    assert recompute_pieces(text, [11, 6, 2, 5]) == [[11], [6], [2], [5]]  # each stage one piece, as priced
    assert (
        "# recompute: each stage (11, 6, 2, 5 layers) is recomputed as one piece, as the plan prices it: "
        "Megatron's uniform groups of 11 end at the stage's last layer\n"
    ) in text
    assert "# vocabulary 512: Megatron takes it from the tokenizer (--tokenizer-type NullTokenizer" in text
    assert "not read from the model" not in text
    assert "# precision" not in text and "# launch: torchrun --nnodes 1 --nproc-per-node 4 pretrain_gpt.py" in text
    # the model cannot be built: the names count 22 layers, and a note says why and what to check
    gone = dataclasses.replace(plan, recipe=dataclasses.replace(plan.recipe, model_file="no/such/gpt.py"))
    fallback = megatron_config(gone, base=coarse_plan.parent)
    assert "--num-layers 22" in _arguments(fallback)
    assert "# the model could not be built (" in fallback and "no/such/gpt.py" in fallback
    assert (
        "# --num-layers 22 counts the layers the block names show; a merged block (a name with '..') may hide "
        "layers after the last one named: check it against the model\n"
    ) in fallback
    with pytest.raises(MegatronRejects, match="hidden_size argument is None"):
        megatron_rules(fallback, 4, model=True)


@pytest.mark.slow  # the gpt_plans fixture plans two models (once per session)
def test_tensor_parallel_plans_say_the_environment_and_the_launch(gpt_plans: dict[str, Path]) -> None:
    plan = Plan.load(gpt_plans["interleaved"])
    text = megatron_args(plan)
    assert (
        "# environment: CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron asserts it for tensor parallelism on Hopper and "
        "older GPUs; not with Megatron FSDP, which asserts the opposite)\n"
    ) in text
    assert (
        "# launch: CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 1 --nproc-per-node 16 pretrain_gpt.py "
        "$(grep -v '^#' ARGS_FILE | xargs)  (the plan does not record GPUs per node: on nodes of g GPUs, "
        "--nnodes 16/g --nproc-per-node g with a rendezvous)\n"
    ) in text
    assert (  # H100 nodes of 8, as autopipe's device catalogue has them and the planner priced
        "# launch: CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py "
        "$(grep -v '^#' ARGS_FILE | xargs)  (8 GPUs per node, as the plan's device has; each node with --node-rank "
        "and a rendezvous)\n"
    ) in megatron_args(plan, devices_per_node=8)
    assert "--bf16" in _arguments(text) and "--fp16" not in text
    one = megatron_args(plan, tensor_parallel=1, sequence_parallel=False)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in one
    assert "# launch: torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py" in one
    assert all(line.startswith(("#", "--")) for line in text.splitlines())  # grep -v '^#' leaves the arguments


@pytest.mark.parametrize(
    ("counts", "p", "form"),
    [
        ([5, 7, 5, 7], 2, "--pipeline-model-parallel-layout"),  # p = 2, v = 2: first/last would divide by zero
        ([2, 4, 2, 4, 2, 4], 2, "--pipeline-model-parallel-layout"),  # p = 2, v = 3
        ([5, 7], 2, "--decoder-first-pipeline-num-layers"),  # p = 2, v = 1: Megatron guards the division
        ([1, 2, 3, 1, 2, 3], 3, "--decoder-first-pipeline-num-layers"),  # p = 3, v = 2: one middle rank
    ],
)
def test_the_first_last_form_only_where_megatrons_offsets_are_right(counts: list[int], p: int, form: str) -> None:
    v = len(counts) // p
    split = megatron_split(_parts(counts), p, v)
    assert split[0] == form
    args = ["--pipeline-model-parallel-size", str(p), "--micro-batch-size", "1", "--global-batch-size", str(p)]
    args += ["--tensor-model-parallel-size", "1", "--num-layers", str(sum(counts)), *split]
    text = "\n".join(shlex.join(args[i : i + 2]) for i in range(0, len(args), 2))
    assert megatron_rules(text, p) == counts  # the offsets check included, where the form is first/last


def test_the_old_p2_interleaved_output_divides_by_zero_in_megatrons_offsets() -> None:
    text = (
        "--tensor-model-parallel-size 1\n--pipeline-model-parallel-size 2\n--micro-batch-size 1\n"
        "--global-batch-size 2\n--num-layers 24\n--decoder-first-pipeline-num-layers 10\n"
        "--decoder-last-pipeline-num-layers 14\n--num-virtual-stages-per-pipeline-rank 2\n"
    )
    a, counts = _split_rules(text, 2)  # validate_args' rules accept it ...
    assert counts == [5, 7, 5, 7]
    with pytest.raises(ZeroDivisionError):  # ... and building rank 1 fails, as in Megatron-Core
        layer_offsets(a, counts)


def test_the_bundled_models_definitions_are_read_from_their_modules() -> None:
    from autopipe.config.megatron import _definition
    from autopipe.config.model_facts import ModelFacts, read_model
    from autopipe.model.load import load_model

    models = Path(__file__).resolve().parents[2] / "models"
    gpt = load_model(f"{models / 'gpt.py'}:build_model", {}, device="meta").model
    assert read_model(gpt, "blocks", 64) == ModelFacts(
        num_layers=4,
        hidden=128,
        heads=4,
        query_groups=4,
        ffn=512,
        vocab=512,
        seq_length=64,
        max_positions=64,
        normalization="LayerNorm",
        activation="gelu",
        position="learned_absolute",
        tied=True,
        bias=True,
    )
    llama = load_model(f"{models / 'llama.py'}:build_model", {}, device="meta").model
    facts = read_model(llama, "layers", 64)
    assert (facts.normalization, facts.activation, facts.position, facts.tied, facts.bias) == (
        "RMSNorm",
        "swiglu",
        "rope",
        False,
        False,
    )
    args, notes = _definition(facts, "")
    assert args == [
        "--hidden-size",
        "128",
        "--ffn-hidden-size",
        "352",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "64",
        "--max-position-embeddings",
        "64",
        "--normalization",
        "RMSNorm",
        "--position-embedding-type",
        "rope",
        "--group-query-attention",
        "--num-query-groups",
        "2",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
    ]
    assert len(notes) == 2 and notes[0].startswith("vocabulary 512: ") and notes[1].startswith("rope: ")


def test_nemotron4s_squared_relu_mlp_is_read_and_written_as_megatron_names_it() -> None:
    from autopipe.config.megatron import _definition
    from autopipe.config.model_facts import read_model
    from autopipe.model.load import load_model

    models = Path(__file__).resolve().parents[2] / "models"
    kwargs = {"mlp": "relu2", "intermediate_size": 96}
    model = load_model(f"{models / 'llama.py'}:build_model", kwargs, device="meta").model
    facts = read_model(model, "layers", 64)
    assert (facts.activation, facts.ffn) == ("squared_relu", 96)
    args, _ = _definition(facts, "")
    assert "--squared-relu" in args and "--swiglu" not in args


def test_what_a_model_does_not_say_is_named_in_one_line() -> None:
    from torch import nn

    from autopipe.config.megatron import _definition
    from autopipe.config.model_facts import read_model

    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(100, 16)
            self.layers = nn.ModuleList([nn.Sequential(nn.Linear(16, 16))])

    args, notes = _definition(read_model(Bare(), "layers"), "")
    assert args == ["--hidden-size", "16"]
    assert notes[-1] == (
        "not read from the model: --num-attention-heads; --num-query-groups; --ffn-hidden-size; --seq-length; "
        "--max-position-embeddings; --normalization; the activation (--swiglu, --squared-relu, or gelu by default); "
        "--position-embedding-type; tied embeddings (--untie-embeddings-and-output-weights); "
        "add them as your model has them"
    )


@pytest.mark.slow  # builds two Hugging Face models (on the meta device)
def test_hugging_face_configs_and_gpt2s_conv1d_are_read() -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    from autopipe.config.model_facts import ModelFacts, read_model

    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32)
        )
        llama = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                num_hidden_layers=2,
                hidden_size=64,
                intermediate_size=176,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=100,
                max_position_embeddings=32,
            )
        )
    common = {"num_layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq_length": 32, "max_positions": 32}
    assert read_model(gpt2, "transformer.h", 32) == ModelFacts(
        **common,
        query_groups=4,
        ffn=256,  # GPT-2's Conv1D (in, out) weights: 4 x 64
        normalization="LayerNorm",
        activation="gelu",
        position="learned_absolute",
        tied=True,
        bias=True,
    )
    assert read_model(llama, "model.layers", 32) == ModelFacts(
        **common,
        query_groups=2,
        ffn=176,
        normalization="RMSNorm",
        activation="swiglu",
        position="rope",
        tied=False,
        bias=False,
    )


@pytest.mark.parametrize(
    ("device", "flags", "note"),
    [
        ("h100: NVIDIA H100 SXM5 80GB (analytic, bf16)", ["--bf16"], None),
        ("a100: NVIDIA A100 (analytic, fp16, t=2 with sequence parallelism)", ["--fp16"], None),
        ("h100: NVIDIA H100 SXM5 80GB (analytic, fp32)", [], None),  # Megatron's default
        ("h100: NVIDIA H100 SXM5 80GB (analytic, tf32)", [], "precision: the plan is priced in tf32: Megatron"),
        ("h100: NVIDIA H100 SXM5 80GB (analytic, fp8)", ["--bf16", "--fp8-format", "hybrid"], "precision: fp8 runs"),
        ("cpu (2 threads)", [], "precision: the plan was measured on cpu (2 threads) and does not record the dtype"),
    ],
)
def test_precision_is_the_dtype_the_plan_was_counted_in(device: str, flags: list[str], note: str | None) -> None:
    from autopipe.config.megatron import _precision

    plan = Plan.load(Path(__file__).parents[1] / "fixtures" / "good_mlp_plan_v1.json")
    args, notes = _precision(dataclasses.replace(plan, profile_device=device))
    assert args == flags
    assert (notes[0].startswith(note) if note else notes == []) and len(notes) <= 1


def test_a_model_without_token_inputs_gets_no_sequence_length() -> None:
    from autopipe.api import megatron_config

    fixture = Path(__file__).parents[1] / "fixtures" / "good_mlp_plan_v1.json"
    text = megatron_config(Plan.load(fixture), base=fixture.parent)  # an MLP: (batch, 16) float features
    assert not any(line.startswith(("--seq-length", "--hidden-size")) for line in _arguments(text))
    assert "# not read from the model: --hidden-size; --num-attention-heads;" in text
    assert "--seq-length; --max-position-embeddings;" in text


def test_strings_from_the_plan_stay_inside_their_comment_line(gpt_plans: dict[str, Path]) -> None:
    """A newline in the plan's model name must not become an argument line through the README's
    ``grep -v '^#' | xargs`` (it would add ``--save``), nor a control character reach the file."""
    plan = dataclasses.replace(Plan.load(gpt_plans["uneven"]), model="x.py\n--save /tmp/pwned\x1b[2J")
    text = megatron_args(plan)
    assert not [a for a in _arguments(text) if a.startswith("--save")] and "\x1b" not in text
    assert text.splitlines()[0].startswith(
        "# Megatron-LM arguments for x.py\\n--save /tmp/pwned\\x1b[2J (autopipe plan"
    )
    assert all(line.startswith(("#", "--")) for line in text.splitlines())


@pytest.mark.parametrize(
    ("kind", "group", "overlap", "present", "absent"),
    [
        (
            Sharding.NONE,
            0,
            Overlap(grad_reduce=True, param_gather=True),
            ["--overlap-grad-reduce"],
            ["--use-distributed-optimizer", "--overlap-param-gather"],
        ),  # param gather needs the distributed optimizer
        (
            Sharding.ZERO1,
            0,
            Overlap(grad_reduce=True, param_gather=True),
            ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"],
            ["--use-megatron-fsdp"],
        ),
        (
            Sharding.ZERO1,
            2,
            Overlap(),
            ["--use-distributed-optimizer", "--num-distributed-optimizer-instances 2"],
            ["--overlap-grad-reduce"],
        ),
        (
            Sharding.ZERO2,
            0,
            Overlap(grad_reduce=True),
            ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads", "--ckpt-format fsdp_dtensor"],
            [],
        ),
        (
            Sharding.ZERO3,
            2,
            Overlap(),
            ["--data-parallel-sharding-strategy optim_grads_params", "--num-distributed-optimizer-instances 2"],
            [],
        ),
        (Sharding.ZERO3_STEP, 0, Overlap(), ["--use-distributed-optimizer"], ["--use-megatron-fsdp"]),
    ],
)
def test_shardings_and_overlaps_become_megatrons_flags(
    kind: Sharding, group: int, overlap: Overlap, present: list[str], absent: list[str]
) -> None:
    plan = dataclasses.replace(_gpt_like(data=4), overlap=overlap)
    if kind != Sharding.NONE:
        plan = _sharded(plan, kind, group)
    text = megatron_args(plan)
    lines = text.splitlines()
    assert all(flag in lines for flag in present), text
    assert not any(line.split(" ")[0] in absent for line in lines), text
    if kind == Sharding.ZERO3_STEP:
        assert "# zero3-step (weights gathered once a step and kept) is ZeRO-1's state and collectives" in text


def test_overlaps_megatron_cannot_run_as_priced_are_said() -> None:
    plan = dataclasses.replace(_gpt_like(data=2), overlap=Overlap(tp_comm=0.5, p2p=True), tensor_parallel=2)
    text = megatron_args(plan)  # 1F1B: Megatron's sends block; tensor parallelism without sequence parallelism
    assert "# Megatron's 1F1B waits on its pipeline sends" in text
    assert "# the plan overlaps tensor-parallel collectives: Megatron does only with --sequence-parallel" in text
    tp = megatron_args(dataclasses.replace(plan, sequence_parallel=True))
    assert "--tp-comm-overlap" in tp.splitlines() and "Transformer Engine's userbuffers" in tp
    fsdp = megatron_args(_sharded(dataclasses.replace(plan, sequence_parallel=True), Sharding.ZERO3))
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun" not in fsdp and "CUDA_DEVICE_MAX_CONNECTIONS unset" in fsdp


def test_gradients_priced_in_bf16_tell_megatron_to_reduce_them_so() -> None:
    """Megatron-LM reduces bf16 gradients in fp32 unless ``--grad-reduce-in-bf16``: a plan priced with
    them in bf16 (``grad_reduce_ratio`` 1, as plans before it and other targets' were) says so; one
    priced in fp32 (2), or without data parallelism, or in fp16 (reduced in fp16 already), does not."""
    bf16 = dataclasses.replace(_gpt_like(data=4), overlap=Overlap(grad_reduce=True))
    assert "--grad-reduce-in-bf16" in megatron_args(bf16).splitlines()
    for plan in (
        dataclasses.replace(bf16, grad_reduce_ratio=2.0),
        dataclasses.replace(_gpt_like(data=1), overlap=Overlap(grad_reduce=True)),
        dataclasses.replace(_gpt_like(data=4, dtype="fp16"), overlap=Overlap(grad_reduce=True)),
    ):
        assert "--grad-reduce-in-bf16" not in megatron_args(plan).splitlines()
