"""A plan as Megatron-LM command-line arguments (``autopipe config PLAN --for megatron``).

The output is one argument per line, ``--flag value``, with ``#`` comment lines for what
Megatron cannot do as the plan says and for what goes beside the arguments (the environment, the
``torchrun`` line); ``grep -v '^#' | xargs`` gives the argument list. What it sets: the degrees
(``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``; the data-parallel size is
what is left of the world size), the batch (``--micro-batch-size``, ``--global-batch-size`` =
batch per pipeline x replicas), ``--num-layers``, the model's own arguments, ``--sequence-parallel``,
the sharding (:func:`data_parallel_args`: ``--use-distributed-optimizer`` for ZeRO-1, Megatron-FSDP's
``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads|optim_grads_params`` for ZeRO-2
and -3, ``--num-distributed-optimizer-instances`` for hybrid groups) and the overlaps the plan
priced (``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--tp-comm-overlap``), the recompute
arguments and the split; context and expert parallelism and a MoE model's own arguments
(:mod:`autopipe.config.parallel_args`).

The model: given the plan's model (:func:`autopipe.api.megatron_config` rebuilds it on the meta
device), the layers are counted from its layer list, since a merged block such as
``blocks.21..lm_head`` names only its ends, and its definition is read from it
(:mod:`autopipe.config.model_facts`: ``--hidden-size``, ``--ffn-hidden-size``,
``--num-attention-heads``, ``--num-query-groups``, ``--seq-length``, ``--max-position-embeddings``,
``--normalization``, ``--swiglu``, ``--position-embedding-type``, untied embeddings, biases; a
``#`` line names what it could not read, and says the vocabulary, which Megatron takes from the
tokenizer, and for a rotary model that Megatron fuses RoPE with Transformer Engine by default, so
that without it ``--no-rope-fusion`` is needed). Without it the layers are counted from the block
names, with a ``#`` line.
``--bf16``/``--fp16`` is the dtype an analytic plan was counted in (its profile device says
``(analytic, bf16)``; autopipe's bf16 is mixed precision with fp32 master weights, as Megatron's);
a measured plan does not record one, and says so in a ``#`` line.

The split is in the first of Megatron-Core's three forms that says it exactly and that
Megatron-Core 0.19 builds (megatron/training/arguments.py ``validate_args`` and
megatron/core/transformer/transformer_config.py allow exactly one):

- even: every (virtual) stage has the same number of layers: just the sizes, plus
  ``--num-layers-per-virtual-pipeline-stage`` when interleaved;
- uneven first/last: the middle ranks are even, the first and/or last rank differ, each rank's
  layers split evenly over its chunks (``--decoder-first-pipeline-num-layers`` /
  ``--decoder-last-pipeline-num-layers``, plus ``--num-virtual-stages-per-pipeline-rank``).
  Exact then: ``get_transformer_layer_offset`` (megatron/core/transformer/transformer_layer.py)
  puts chunk ``k`` of rank ``r`` at ``k x (layers per round) + first/v + (r - 1) x middle/v``,
  which is the plan's when the middle ranks are equal and every count divides by ``v``. Not with
  p = 2 and v > 1: there are no middle ranks and the interleaved offset divides by their number
  (ZeroDivisionError building rank 1), so those plans take the layout string;
- anything else: ``--pipeline-model-parallel-layout``, Megatron's layout string
  (megatron/core/transformer/pipeline_parallel_layer_layout.py): stages in virtual-stage order
  separated by ``|``, ``E`` the embedding, ``t`` a transformer layer (``t*3`` = ``ttt``),
  ``L`` the loss (with the final norm and head); it excludes the other two forms.

Megatron runs 1F1B, or interleaved 1F1B when a rank holds several chunks, placing chunk ``j`` on
rank ``j % p``; a plan with another schedule gets a note saying what Megatron runs instead.
A plan's uniform memory choice is Megatron's own (``Plan.memory_choice``): ``--recompute-granularity
selective --recompute-modules`` (a dense MLP's activation alone, autopipe's ``mlp_act``, becomes the
whole ``mlp``, with a note), ``--recompute-granularity full --recompute-method block
--recompute-num-layers k``, ``--fine-grained-activation-offloading --offload-modules`` (with
Transformer Engine's ``NVTE_CPU_OFFLOAD_V1=1`` on the launch line).
Whole-stage recomputation: Megatron's ``full`` granularity with ``uniform`` groups of N = the largest stage's
layers recomputes each stage as one piece, as the plan prices it (megatron/core/recompute.py
clips a group at the stage's last layer, so N need not divide a stage); it applies to every
stage, so a plan that recomputes only some gets a note. Tensor parallelism adds the environment
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (``validate_args`` asserts it on Hopper and older; not with
Megatron-FSDP, which asserts the opposite and with tensor parallelism only warns) to the
``# launch: torchrun`` line, whose nodes are the plan's catalogue device's GPUs per node where
the caller knows them.
"""

from __future__ import annotations

import shlex

from torch import nn

from autopipe._io import one_line
from autopipe.config.model_facts import ModelFacts, read_model
from autopipe.config.parallel_args import megatron_parallel_args, read_moe
from autopipe.config.parts import Degrees, Parts, degrees, model_parts, stage_list
from autopipe.config.retarget import retarget_notes
from autopipe.plans import Plan
from autopipe.schedules.registry import schedule_spec

__all__ = ["MEGATRON_SCHEDULES", "data_parallel_args", "layout_string", "megatron_args", "megatron_split"]

MEGATRON_SCHEDULES = ("Schedule1F1B", "ScheduleInterleaved1F1B")
"""The torch classes of the schedules Megatron itself runs (non-interleaved and interleaved 1F1B)."""


def layout_string(parts: Parts, mtp: int = 0) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for the plan's stages, e.g.
    ``Et|tt|tt|tL``: the embedding on the first stage, the loss on the last; three or more equal
    stages in a row as ``(tt|)*34``, more than four layers as ``t*5`` (Megatron unrolls both).
    ``mtp`` multi-token-prediction layers go on the last stage before the loss (``mL``): Megatron
    wants each one in the layout (``--mtp-num-layers``), after every decoder layer, all in one
    virtual stage, as the frameworks run the head part."""
    last = len(parts.chunks) - 1
    stages = []
    for chunk in parts.chunks:
        n = chunk.layers
        layers = "t" * n if n <= 4 else f"t*{n}"
        stages.append(("E" if chunk.index == 0 else "") + layers + ("m" * mtp + "L" if chunk.index == last else ""))
    out, i = "", 0
    while i < len(stages):
        run = 1
        while i + run < last and stages[i + run] == stages[i]:  # a run never takes the last stage
            run += 1
        if run >= 3:
            out += f"({stages[i]}|)*{run}"  # unrolls to run stages, each followed by '|'
            i += run
        else:
            out += stages[i] + ("|" if i < last else "")
            i += 1
    return out


def megatron_split(parts: Parts, p: int, v: int, mtp: int = 0) -> list[str]:
    """The split arguments (flag, value, flag, value, ...) in the first form that is exact
    (``mtp``: the model's multi-token-prediction layers, which a layout string names)."""
    counts = [c.layers for c in parts.chunks]  # chunk j = vpp rank j // p on pipeline rank j % p
    if p == 1:
        return []  # no pipeline: every layer on the one rank, in one piece
    if len(set(counts)) == 1:
        return [] if v == 1 else ["--num-layers-per-virtual-pipeline-stage", str(counts[0])]
    per_rank = [[counts[i * p + k] for i in range(v)] for k in range(p)]
    even_ranks = all(len(set(r)) == 1 for r in per_rank)
    totals = [sum(r) for r in per_rank]
    middle = set(totals[1:-1])
    safe = v == 1 or p > 2  # p = 2, v > 1: Megatron-Core's offset divides by the middle ranks, of which there are none
    if safe and even_ranks and len(middle) <= 1 and all(totals):
        mid = middle.pop() if middle else None
        args: list[str] = []
        if mid is None or totals[0] != mid:
            args += ["--decoder-first-pipeline-num-layers", str(totals[0])]
        if mid is None or totals[-1] != mid:
            args += ["--decoder-last-pipeline-num-layers", str(totals[-1])]
        if v > 1:
            args += ["--num-virtual-stages-per-pipeline-rank", str(v)]
        return args
    return ["--pipeline-model-parallel-layout", layout_string(parts, mtp)]


MEGATRON_RECOMPUTE = {"core_attn": "core_attn", "layernorm": "layernorm", "mla_up_proj": "mla_up_proj", "mlp": "mlp"}
"""The plan's recompute module kinds Megatron-LM names for a dense layer (``--recompute-modules``);
the dense MLP's activation alone (``mlp_act``) it recomputes only in MoE experts (``moe_act``)."""


def _memory_choice(plan: Plan, deg: Degrees) -> tuple[list[str], list[str]]:
    """The arguments and notes of the plan's uniform memory choice (``Plan.memory_choice``):
    selective recomputation, the block method, fine-grained activation offloading."""
    if plan.recompute_layers:
        k = plan.recompute_layers
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(k)], [
            f"recompute: the first {k} layer(s) of each stage (each model chunk) whole, as the plan prices it"
        ]
    if plan.offload_modules:
        return ["--fine-grained-activation-offloading", "--offload-modules", *plan.offload_modules], [
            "offload: the saved inputs of "
            + ", ".join(plan.offload_modules)
            + " go to the host in every layer (Transformer Engine's layers, --transformer-impl transformer_engine, "
            "Megatron's default; environment NVTE_CPU_OFFLOAD_V1=1 for Transformer Engine 2.10 and later)"
        ]
    kinds = [MEGATRON_RECOMPUTE.get(k, "mlp") for k in plan.recompute_modules]
    if deg.selective_recompute:
        kinds.append("core_attn")
    kinds = sorted(set(kinds), key=["core_attn", "layernorm", "mla_up_proj", "mlp"].index)
    notes = []
    if "mlp_act" in plan.recompute_modules:
        notes.append(
            "the plan recomputes the MLP's activation alone (mlp_act), which Megatron-LM recomputes only in MoE "
            "experts (moe_act): these arguments recompute the whole MLP (mlp) instead, less memory than priced "
            "and its linear layers' forward again besides"
        )
    args = ["--recompute-granularity", "selective", "--recompute-modules", *kinds]
    if "layernorm" in kinds and plan.precision == "fp8":
        args += ["--fp8-recipe", "tensorwise"]
        notes.append(
            "fp8 with layernorm recomputation: Megatron refuses delayed scaling there, so --fp8-recipe tensorwise "
            "(current scaling; Transformer Engine 2.6 or later)"
        )
    return args, notes


def _recompute(plan: Plan, deg: Degrees, parts: Parts) -> tuple[list[str], list[str]]:
    """The recompute arguments and notes."""
    chosen = [s.index for s in plan.stages if s.recompute]
    if plan.memory_choice:
        return _memory_choice(plan, deg)
    if not chosen:
        if deg.selective_recompute:
            return ["--recompute-granularity", "selective"], []
        return [], []
    sizes = sorted({c.layers for c in parts.chunks if c.layers})
    group = sizes[-1]  # groups of the largest stage's layers: every stage is one group (Megatron clips it)
    args = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", str(group)]
    if len(sizes) == 1:
        notes = [f"recompute: each stage's {group} layer(s) are recomputed as one piece, as the plan prices it"]
    else:
        each = ", ".join(str(c.layers) for c in parts.chunks)
        notes = [
            f"recompute: each stage ({each} layers) is recomputed as one piece, as the plan prices it: "
            f"Megatron's uniform groups of {group} end at the stage's last layer"
        ]
    if len(chosen) < len(plan.stages):
        rest = [s.index for s in plan.stages if not s.recompute]
        notes.append(
            f"the plan recomputes stage(s) {stage_list(chosen)} only; Megatron recomputes every stage, "
            f"so stage(s) {stage_list(rest)} spend an extra forward the plan did not price"
        )
    if deg.selective_recompute:
        notes.append("the plan also asks for selective (attention) recomputation; full recomputation covers it")
    return args, notes


def _schedule_notes(plan: Plan, parts: Parts) -> list[str]:
    spec = schedule_spec(plan.schedule)
    runs = "interleaved 1F1B" if plan.virtual > 1 else "1F1B"
    notes = []
    if plan.devices == 1:
        return (
            [f"one pipeline rank: Megatron runs its {len(plan.stages)} stage(s) as one model chunk"]
            if plan.virtual > 1
            else []
        )
    if spec.torch_class not in MEGATRON_SCHEDULES:
        why = []
        if spec.splits_backward:
            why.append("no separate weight-gradient pass")
        if not parts.round_robin:
            why.append(f"chunk j on rank j % {plan.devices}, not in the plan's V")
        extra = f" ({'; '.join(why)})" if why else ""
        notes.append(
            f"Megatron has no {plan.schedule} schedule: it runs {runs} with these stages instead{extra}; "
            "expect the 1F1B bubble, not the plan's prediction"
        )
    return notes


_UNREAD = {  # a ModelFacts field the model did not answer -> the argument(s) the user adds
    "hidden": "--hidden-size",
    "heads": "--num-attention-heads",
    "query_groups": "--num-query-groups",
    "ffn": "--ffn-hidden-size",
    "seq_length": "--seq-length",
    "max_positions": "--max-position-embeddings",
    "normalization": "--normalization",
    "activation": "the activation (--swiglu, --squared-relu, or gelu by default)",
    "position": "--position-embedding-type",
    "tied": "tied embeddings (--untie-embeddings-and-output-weights)",
    "bias": "biases (--disable-bias-linear)",
}


def _definition(facts: ModelFacts | None, unbuilt: str) -> tuple[list[str], list[str]]:
    """The model's own arguments (hidden size, heads, ...) and notes on what could not be read."""
    if facts is None:
        return [], [
            f"the model could not be built ({unbuilt or 'no model given'}): add its own arguments "
            "(--hidden-size, --num-attention-heads, --seq-length, --max-position-embeddings, ...)"
        ]
    f = facts
    args: list[str] = []
    for flag, value in (
        ("--hidden-size", f.hidden),
        ("--ffn-hidden-size", f.ffn),
        ("--num-attention-heads", f.heads),
        ("--seq-length", f.seq_length),
        ("--max-position-embeddings", f.max_positions),
        ("--normalization", f.normalization),
        ("--position-embedding-type", f.position),
    ):
        if value is not None:
            args += [flag, str(value)]
    if f.query_groups is not None and f.heads is not None and f.query_groups != f.heads:
        args += ["--group-query-attention", "--num-query-groups", str(f.query_groups)]
    args += ["--swiglu"] if f.activation == "swiglu" else []  # gelu is Megatron's default
    args += ["--squared-relu"] if f.activation == "squared_relu" else []
    args += ["--untie-embeddings-and-output-weights"] if f.tied is False else []
    args += ["--disable-bias-linear"] if f.bias is False else []
    notes = []
    if f.vocab is not None:
        notes.append(
            f"vocabulary {f.vocab}: Megatron takes it from the tokenizer (--tokenizer-type NullTokenizer "
            f"--vocab-size {f.vocab} for synthetic data) and pads it to a multiple of --make-vocab-size-divisible-by"
        )
    if f.position == "rope":
        notes.append(
            "rope: Megatron fuses the rotary embedding with Transformer Engine by default; without Transformer "
            "Engine >= 1.4 its TransformerConfig refuses that (apply_rope_fusion is not available): "
            "add --no-rope-fusion"
        )
    unread = [_UNREAD[n] for n in f.unread if n in _UNREAD]
    if unread:
        notes.append(f"not read from the model: {'; '.join(unread)}; add them as your model has them")
    return args, notes


def _launch(deg: Degrees, per_node: int | None, offload: bool = False) -> list[str]:
    """The environment and the ``torchrun`` line, as notes; ``per_node``: GPUs per node, if known;
    ``offload``: the plan offloads activations (Transformer Engine 2.10+ asks NVTE_CPU_OFFLOAD_V1=1)."""
    env = "NVTE_CPU_OFFLOAD_V1=1 " if offload else ""
    notes = []
    if (deg.tensor > 1 or deg.context > 1) and deg.sharding in _FSDP:  # Megatron-FSDP asserts it is not 1
        notes.append(
            "environment: CUDA_DEVICE_MAX_CONNECTIONS unset (Megatron-FSDP asserts it is not 1; with tensor or "
            "context parallelism Megatron wants it 1: the two want different settings)"
        )
    elif deg.tensor > 1 or deg.context > 1:
        env += "CUDA_DEVICE_MAX_CONNECTIONS=1 "
        what = "tensor parallelism" if deg.context == 1 else "context parallelism" if deg.tensor == 1 else "both"
        notes.append(
            f"environment: CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron asserts it for {what} on Hopper and "
            "older GPUs; not with Megatron FSDP, which asserts the opposite)"
        )
    world = deg.world_size
    if per_node is not None and world > per_node and world % per_node == 0:
        nodes, procs = world // per_node, per_node
        where = f"  ({per_node} GPUs per node, as the plan's device has; each node with --node-rank and a rendezvous)"
    else:
        nodes, procs, where = 1, world, ""
        if per_node is None:
            where = (
                f"  (the plan does not record GPUs per node: on nodes of g GPUs, --nnodes {world}/g "
                "--nproc-per-node g with a rendezvous)"
            )
    notes.append(
        f"launch: {env}torchrun --nnodes {nodes} --nproc-per-node {procs} pretrain_gpt.py "
        f"$(grep -v '^#' ARGS_FILE | xargs){where}"
    )
    return notes


def _precision(plan: Plan) -> tuple[list[str], list[str]]:
    """``--bf16`` / ``--fp16`` from the dtype an analytic plan was counted in (its profile device
    says it: ``h100: ... (analytic, bf16)``); a note where the plan does not say. ``fp8``:
    ``--bf16 --fp8-format hybrid`` (Transformer Engine's FP8 linear layers, e4m3 forward and e5m2
    gradients, bf16 elsewhere: what the plan priced; ``TransformerConfig.fp8``'s flag)."""
    dtype = plan.precision
    if dtype is None:
        return [], [
            f"precision: the plan was measured on {plan.profile_device} and does not record the dtype; "
            "add --bf16 or --fp16 if you train in one (Megatron's default is fp32)"
        ]
    if dtype == "tf32":
        return [], ["precision: the plan is priced in tf32: Megatron trains in fp32 (TF32 matmuls are torch's setting)"]
    if dtype == "fp8":
        return ["--bf16", "--fp8-format", "hybrid"], [
            "precision: fp8 runs through Transformer Engine (--transformer-impl transformer_engine, Megatron's "
            "default) on an FP8 GPU (H100/H200); the scaling recipe is Megatron's default (--fp8-recipe delayed)"
        ]
    return {"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(dtype, []), []


def megatron_args(
    plan: Plan,
    *,
    tensor_parallel: int | None = None,
    sequence_parallel: bool | None = None,
    selective_recompute: bool | None = None,
    zero1: bool | None = None,
    model: nn.Module | None = None,
    seq_length: int | None = None,
    unbuilt: str = "",
    devices_per_node: int | None = None,
) -> str:
    """The plan as Megatron-LM arguments, one per line, with ``#`` notes; ConfigError (one
    line) for a plan without transformer layers. ``model`` is the plan's model (built on the
    meta device is enough): its layers are counted and its definition read from it; without it
    (``unbuilt`` says why) the layers are counted from the plan's block names.
    ``devices_per_node`` (GPUs per node, where known) shapes the ``# launch:`` line."""
    deg = degrees(plan, tensor_parallel, sequence_parallel, selective_recompute, zero1)
    facts = read_model(model, model_parts(plan).container, seq_length) if model is not None else None
    parts = model_parts(plan, facts.num_layers if facts is not None else None)
    lines = [
        f"# Megatron-LM arguments for {one_line(plan.model)} (autopipe plan: {plan.schedule}, "
        f"{plan.micro_batches} micro-batch(es) of {plan.micro_batch_size})",
        f"# world size {deg.sizes}",
    ]
    args = [
        "--tensor-model-parallel-size",
        str(deg.tensor),
        "--pipeline-model-parallel-size",
        str(deg.pipeline),
        "--micro-batch-size",
        str(plan.micro_batch_size),
        "--global-batch-size",
        str(plan.batch_size * deg.data),
        "--num-layers",
        str(parts.num_layers),
    ]
    definition, notes = _definition(facts, unbuilt)
    moe = read_moe(model, parts.container) if model else None
    parallel, parallel_notes = megatron_parallel_args(deg, moe)
    definition += parallel
    notes += parallel_notes
    if facts is None and any(".." in b for s in plan.stages for b in s.blocks):
        notes.append(
            f"--num-layers {parts.num_layers} counts the layers the block names show; a merged block "
            "(a name with '..') may hide layers after the last one named: check it against the model"
        )
    precision, precision_notes = _precision(plan)
    notes += [*precision_notes, *parts.notes, *_schedule_notes(plan, parts)]
    notes += _launch(deg, devices_per_node, bool(plan.offload_modules))
    sharded, sharded_notes = data_parallel_args(plan, deg)
    args += sharded
    notes += sharded_notes
    if deg.sequence_parallel and deg.tensor > 1:
        args.append("--sequence-parallel")
    elif deg.sequence_parallel:
        notes.append("sequence parallelism needs tensor parallelism (t > 1); Megatron turns it off at t = 1")
    split = megatron_split(parts, deg.pipeline, deg.virtual, moe.mtp_layers if moe else 0)
    if split[:1] == ["--pipeline-model-parallel-layout"]:
        notes.append(_layout_note(parts, deg))
    recompute, recompute_notes = _recompute(plan, deg, parts)
    notes += recompute_notes + retarget_notes(plan, "megatron")
    lines += [f"# {one_line(n)}" for n in notes]  # a note quoting the plan stays one comment line
    return "\n".join(lines + _argument_lines(args + definition + precision + split + recompute)) + "\n"


_FSDP = {"zero2": "optim_grads", "zero3": "optim_grads_params"}  # Megatron-FSDP's --data-parallel-sharding-strategy


def data_parallel_args(plan: Plan, deg: Degrees) -> tuple[list[str], list[str]]:
    """The sharding and overlap arguments, and notes: the distributed optimizer (ZeRO-1, and
    ZeRO-3 gathered once a step, which prices the same), Megatron-FSDP for ZeRO-2 and -3
    (``--data-parallel-sharding-strategy``), hybrid groups as distributed-optimizer instances,
    the overlaps the plan assumed (``--overlap-grad-reduce``, ``--overlap-param-gather``,
    ``--tp-comm-overlap``, interleaving's asynchronous sends)."""
    args: list[str] = []
    notes: list[str] = []
    over, sharding = plan.overlap, deg.sharding
    if sharding == "zero3-step":
        notes.append(
            "zero3-step (weights gathered once a step and kept) is ZeRO-1's state and collectives: "
            "Megatron's distributed optimizer runs it"
        )
    if deg.zero1:
        args.append("--use-distributed-optimizer")  # the optimizer state split over the data-parallel ranks
    if sharding in _FSDP:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", _FSDP[sharding]]
        args += ["--ckpt-format", "fsdp_dtensor"]  # validate_args asserts it for Megatron-FSDP
        notes.append(
            f"{sharding}: Megatron-FSDP shards the {'gradients' if sharding == 'zero2' else 'weights and gradients'} "
            "too; it needs CUDA_DEVICE_MAX_CONNECTIONS unset or above 1"
        )
    if deg.shard_group and deg.data > 1:
        args += ["--num-distributed-optimizer-instances", str(deg.data // deg.shard_group)]
    if deg.data > 1 and plan.precision in ("bf16", "fp8") and plan.grad_reduce_ratio == 1.0:
        # Megatron reduces bf16 gradients in fp32 (accumulate_allreduce_grads_in_fp32) unless told;
        # the plan priced them in bf16
        args.append("--grad-reduce-in-bf16")
    if deg.data > 1 and over.grad_reduce:
        args.append("--overlap-grad-reduce")
        if over.param_gather and deg.zero1:  # validate_args: only with the distributed optimizer or FSDP
            args.append("--overlap-param-gather")
    if over.tp_comm > 0 and deg.tensor > 1:
        if deg.sequence_parallel:
            args.append("--tp-comm-overlap")
            notes.append(
                f"--tp-comm-overlap: the plan hid {over.tp_comm:.0%} of the tensor-parallel collectives; "
                "Megatron overlaps them through Transformer Engine's userbuffers (TE installed, its default impl)"
            )
        else:
            notes.append("the plan overlaps tensor-parallel collectives: Megatron does only with --sequence-parallel")
    if deg.pipeline > 1 and deg.virtual > 1 and not over.p2p:
        if deg.pipeline > 2:
            args.append("--no-overlap-p2p-communication")
        else:
            notes.append("two interleaved pipeline ranks: Megatron overlaps their sends (validate_args), the plan not")
    elif deg.pipeline > 1 and deg.virtual == 1 and over.p2p:
        notes.append(
            "Megatron's 1F1B waits on its pipeline sends (validate_args turns overlap_p2p_comm off without "
            "interleaving); the plan priced them asynchronous"
        )
    return args, notes


def _layout_note(parts: Parts, deg: Degrees) -> str:
    """Why the split is a layout string: the first reason :func:`megatron_split` met."""
    p, v = deg.pipeline, deg.virtual
    per_rank = [[parts.chunks[i * p + k].layers for i in range(v)] for k in range(p)]
    empty = [k for k, r in enumerate(per_rank) if not sum(r)]
    if p == 2 and v > 1:
        return (
            "two pipeline ranks with interleaving: the split is a layout string (Megatron-Core's first/last-stage "
            "form divides by the ranks between the first and last, none here, when it builds rank 1)"
        )
    if empty:
        return (
            f"pipeline rank(s) {stage_list(empty)} hold no transformer layer, so the split is a layout string "
            "(it places a stage of only the embedding or only the loss exactly)"
        )
    if any(len(set(r)) > 1 for r in per_rank):
        return (
            "a rank's chunks differ in layers, so the split is a layout string (the first/last-stage form splits "
            "each rank's layers evenly over its chunks)"
        )
    return (
        "the stages are uneven beyond the first and last, so the split is a layout string "
        "(it excludes --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank)"
    )


def _argument_lines(flat: list[str]) -> list[str]:
    """``["--a", "1", "--b", "--c", "x", "y"]`` -> ``["--a 1", "--b", "--c x y"]``: a flag with
    all its values on one line (``--recompute-modules core_attn mlp``), quoted for the shell."""
    lines: list[str] = []
    for word in flat:
        if word.startswith("--") or not lines:
            lines.append(word)
        else:
            lines[-1] += " " + shlex.quote(word)
    return lines
