"""Published end-to-end training runs, as data (issue 24, item 4; read by bench/bench_published.py).

Each :class:`Run` is one published figure: the model (a bundled model file and its kwargs), the
cluster (catalogue device, GPU count, the network between nodes), the layout the run used
(t x p x d, virtual stages, context parallelism, micro-batch, global batch, sequence,
recomputation, sharding, dtype) and the throughput it published, in the source's own unit, with
the source beside it. ``unpublished`` says what the source does not give (the planner searches
it or the row assumes it, as written); ``unverified`` what could not be checked against a stored
copy of the source. A row with ``verified=False`` is printed but left out of the error statistics.

Mixture-of-experts rows (issue 25): ``model="moe"`` (models/moe.py's presets), ``ep`` the
expert-parallel degree, ``imbalance`` the routing skew the planner prices (1.0 where the source
force-balances the tokens, as Megatron-Bridge's MoE benchmarks say they do).

Runs the planner does not price here, with their sources, for later:

- Llama 3 405B, 16,384 H100, TP 8 CP 16 PP 16 DP 8, sequence 131,072, 16M tokens per batch,
  380 TFLOP/s per GPU (Grattafiori et al. 2024, Table 4, via Balaji's SC'24 slide quoted at
  glennklockwood.com/garden/llama-3.1).
- NeMo 24.07 FP8 on DGX-H100 (NVIDIA/NeMo docs/source/performance/performance_summary.md, git
  d31653f7): LLAMA3-8B 8 GPUs, GBS 128, MBS 1, 8192 tokens, TP 1 PP 1 CP 2: 12,036 tokens/s per
  GPU (697 TFLOP/s); LLAMA3-70B 64 GPUs, GBS 128, TP 4 PP 4 CP 2 VP 5: 1,533 (738).
- Megatron-Bridge 26.04.01 FP8 on DGX-H100 (NVIDIA-NeMo/Megatron-Bridge
  docs/performance-summary-archive.md, git 067f987d): LLAMA3.1_405B 1,024 GPUs, GBS 1536, MBS 1,
  8192 tokens, TP 8 PP 8 CP 2 VP 8: 328 tokens/s per GPU (827 TFLOP/s).
- Mixture of experts on DGX-H100, same archive: Qwen3_30B_a3B 16 GPUs (EP 8), GPT OSS 120B
  64 GPUs (BF16, EP 8): no bundled preset.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CALIBRATION", "LINKS", "RUNS", "Link", "Run", "by_name"]

HW, MODEL = "hardware", "model"  # the source's FLOP count: with recomputation (hardware) or without
TFLOPS, TOKENS, STEP = "TFLOP/s per GPU", "tokens/s per GPU", "s per step"  # the published figure's unit
RECOMPUTE = ("full", "selective", "none", "unknown")
# fsdp: ZeRO-3, the weights gathered per use; fsdp-step: FSDP gathering the weights once a step and keeping them,
# the gradients accumulated whole and reduce-scattered once (planner/placement.py's zero3-step)
SHARDING = ("none", "zero1", "zero2", "fsdp", "fsdp-step", "unknown")


@dataclass(frozen=True)
class Link:
    """The network between a cluster's nodes, as the planner prices it: one device's share."""

    name: str  # as the source (or the system's datasheet) says it
    network_bandwidth: float  # bytes/s per device, one direction (planner Cluster.network_bandwidth)


LINKS = {
    "selene": Link("InfiniBand HDR 200 Gb/s x 8 per node (Selene)", 25e9),
    "jean-zay": Link("Omni-Path 100 Gb/s x 4 per node (Jean Zay)", 6.25e9),
    "dgx-h100": Link("InfiniBand NDR 400 Gb/s x 8 per node (DGX H100)", 50e9),
    "meta-roce": Link("RoCE 400 Gb/s per GPU (Meta's 24K H100 cluster)", 50e9),
    "deepseek-ib": Link("InfiniBand 400 Gb/s per GPU (DeepSeek-V3's H800 cluster, Sec. 3.1: 50 GB/s)", 50e9),
}


@dataclass(frozen=True)
class Run:
    """One published run: its model, cluster, layout and figure, and where they come from."""

    name: str  # short and unique: the --rows name and the written plan's file name
    model: str  # a bundled model file: "gpt" (models/gpt.py) or "llama" (models/llama.py)
    kwargs: tuple[tuple[str, object], ...]  # its build_model keywords
    device: str  # catalogue name (autopipe/costs/devices.json)
    dtype: str  # "bf16" or "fp8" (Transformer Engine's FP8 linear layers)
    link: str  # a key of LINKS
    gpus: int
    t: int  # tensor-parallel degree
    p: int  # pipeline depth
    d: int  # data-parallel replicas
    vp: int | None  # virtual stages per pipeline rank (1: no interleaving; None: not published)
    mbs: int | None  # micro-batch size (None: not published)
    global_batch: int  # sequences per step
    seq: int  # tokens per sequence
    recompute: str  # RECOMPUTE: what the run recomputed
    sharding: str  # SHARDING: optimizer / gradient / weight sharding over the data-parallel group
    sequence_parallel: bool  # Korthikanti et al. 2022, with t > 1
    figure: float  # the published throughput, in ``unit``
    unit: str  # TFLOPS, TOKENS or STEP
    flops: str  # HW or MODEL: what the source's FLOP figures count ("" for none)
    source: str  # where every figure above was read
    unpublished: str = ""  # what the source does not say, and what the row does instead
    unverified: str = ""  # what could not be checked against a stored copy of the source
    verified: bool = True  # the figure and the layout were checked (False: out of the statistics)
    cp: int = 1  # context-parallel degree
    also: str = ""  # the source's other figures for the same run (for people)
    attention: str = "flash"  # "flash": a fused attention kernel; "unfused": the scores materialised (before 2022)
    tp_comm_overlap: bool = False  # the source says it ran Megatron's --tp-comm-overlap
    dp_overlap: bool = True  # the gradients reduced (and weights gathered) under the computation, as Megatron-Core
    # the gradients reduced under the computation (Megatron's --overlap-grad-reduce; False where the
    # source turned it off and left the weights' gather overlapped)
    grad_overlap: bool = True
    ep: int = 1  # expert-parallel degree (a MoE's routed experts over ep devices)
    imbalance: float = 1.0  # the routing skew the planner prices (costs.experts), for a MoE
    # the gradients reduced in fp32 (4 bytes per parameter over the data-parallel group; False: in the
    # weights' 2-byte dtype): the note above the Megatron-LM 2021 rows says where each row's answer comes from
    grad_reduce_fp32: bool = True
    # the loss computed by a fused cross-entropy kernel (False: Megatron-LM's unfused
    # vocab_parallel_cross_entropy, costs/losses.py): the note above the Megatron-LM 2021 rows says which
    loss_fusion: bool = True
    recompute_modules: tuple[str, ...] = ()  # with recompute "selective": the source's --recompute-modules
    # The source ran DeepEP (Megatron-Core's flex dispatcher, --moe-enable-deepep): a token crosses to a
    # node once, to at most ``max_nodes`` nodes (the model's group-limited routing; 0: no limit), and its
    # kernels hold ``DEEPEP_SMS`` of the device's SMs while they run (costs.experts, planner.cluster.experts)
    deepep: bool = False
    max_nodes: int = 0

    def __post_init__(self) -> None:
        if self.t * self.p * self.d * self.cp != self.gpus:
            raise ValueError(f"{self.name}: t x p x d x cp = {self.t * self.p * self.d * self.cp}, not {self.gpus}")
        if self.global_batch % self.d or (self.mbs and (self.global_batch // self.d) % self.mbs):
            raise ValueError(f"{self.name}: batch {self.global_batch} does not split into {self.d} x {self.mbs}")
        if self.recompute not in RECOMPUTE or self.sharding not in SHARDING or self.link not in LINKS:
            raise ValueError(f"{self.name}: recompute, sharding or link not one of the known words")
        if self.recompute_modules and self.recompute != "selective":
            raise ValueError(
                f"{self.name}: recompute modules {self.recompute_modules} with recompute {self.recompute!r}"
            )
        if self.attention not in ("flash", "unfused"):
            raise ValueError(f"{self.name}: attention {self.attention!r} is neither flash nor unfused")
        if self.unit not in (TFLOPS, TOKENS, STEP) or (self.unit == TFLOPS and self.flops not in (HW, MODEL)):
            raise ValueError(f"{self.name}: unit {self.unit!r} with FLOP count {self.flops!r}")

    @property
    def model_kwargs(self) -> dict[str, object]:
        return dict(self.kwargs)

    @property
    def family(self) -> tuple[str, str]:
        """What one calibration covers: the device type and dtype."""
        return self.device, self.dtype


def by_name(name: str) -> Run:
    found = [r for r in RUNS if r.name == name]
    if not found:
        raise KeyError(f"no published run {name!r}; the runs: {', '.join(r.name for r in RUNS)}")
    return found[0]


def _gpt(
    layers: int, hidden: int, heads: int, vocab: int, seq: int, tied: bool = True
) -> tuple[tuple[str, object], ...]:
    kwargs: dict[str, object] = {"n_layer": layers, "n_embd": hidden, "n_head": heads}
    kwargs |= {"vocab_size": vocab, "block_size": seq}
    return tuple(kwargs.items()) + (() if tied else (("tie_embeddings", False),))


# --- Megatron-LM 2021: GPT on A100-80GB (Selene) ---------------------------------------------

# Attention before FlashAttention (Dao et al. 2022): Megatron-LM in April 2021 (its CoreAttention: baddbmm
# of the scores, FusedScaleMaskSoftmax, dropout, bmm; megatron/model/transformer.py) and Megatron-DeepSpeed
# for BLOOM (the same module) materialise the (s x s) scores of every head.
UNFUSED = "unfused"
# Gradients reduced in fp32 (the planner's megatron target: planner/placement.py) where the framework does:
# Megatron-LM turns accumulate_allreduce_grads_in_fp32 on for --bf16 (megatron/arguments.py since 2021, git
# 50a4b5fa l.139-142; training/arguments.py of core_r0.8.0, the Megatron-Core table's version, l.302-305: "bfloat16
# requires gradient accumulation and all-reduce to be done in fp32"), and its DDP then reduces the fp32
# main_grad buffer (core/distributed: grad_reduce_in_fp32); DeepSpeed's BF16_Optimizer (BLOOM) reduces its
# fp32_groups_gradients_flat (get_grads_for_reduction); Meta's Llama 3 reduce-scatters its gradients in FP32
# (the paper, Sec. 3.3.2, recalled). Not: the Megatron-LM 2021 runs, fp16 (README git 50a4b5fa: "half
# precision"; its examples pass --fp16, for which the reduction stays in fp16), and the FP8 rows: NeMo's
# performance scripts set grad_reduce_in_fp32 = False with FP8 (NeMo 2.0 scripts/performance; the 24.07 and
# Megatron-Bridge rows' own configs not stored: assumed the same).
# The loss: Megatron-LM computed it unfused (vocab_parallel_cross_entropy, costs/losses.py) in 2021 (no fused
# cross entropy existed; Megatron-DeepSpeed for BLOOM the same module) and in core_r0.8.0, the Megatron-Core
# table's version, unless --cross-entropy-loss-fusion (opt-in, arguments.py; the table names its overlap
# flags, not this one). The other rows keep the fused kernel (NeMo's and Meta's settings not stored).
# Nor did they overlap the data-parallel gradient reduction: Megatron-LM in 2021 all-reduced the gradients
# after the pipeline's flush (--overlap-grad-reduce came with its distributed optimizer's rework, 2023), and
# DeepSpeed's pipeline engine reduces them after the last micro-batch (PipelineEngine's ReduceGrads step).

M21 = (
    "Narayanan et al. 2021 (SC'21), Table 1, read from Megatron-LM's README table "
    "images/cases_april2021.png (git 50a4b5fa, 2021-04-08): hidden size, layers, t x p, GPUs, batch, TFLOP/s "
    "(counted with recomputation); vocabulary 51,200, 2,048 tokens, 8 A100 80GB per node; t = 8 where t x p > 8 "
    "(README, git 2d767f48)"
)


def _m21(name: str, heads: int, hidden: int, layers: int, t: int, p: int, gpus: int, batch: int, tf: float) -> Run:
    return Run(
        name=f"m21-{name}",
        model="gpt",
        kwargs=_gpt(layers, hidden, heads, 51200, 2048),
        device="a100-80gb",
        dtype="bf16",
        link="selene",
        gpus=gpus,
        t=t,
        p=p,
        d=gpus // (t * p),
        vp=None,
        mbs=None,
        global_batch=batch,
        seq=2048,
        recompute="full",
        sharding="none",
        sequence_parallel=False,
        figure=tf,
        unit=TFLOPS,
        flops=HW,
        source=M21,
        unpublished="micro-batch and interleaving: searched (1F1B or interleaved 1F1B)",
        unverified="attention heads (the paper's Table 1; not in the README image; no effect on the FLOP count)",
        attention=UNFUSED,
        dp_overlap=False,
        grad_reduce_fp32=False,
        loss_fusion=False,
    )


MEGATRON_2021 = (
    _m21("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137.0),
    _m21("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138.0),
    _m21("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142.0),
    _m21("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135.0),
    _m21("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138.0),
    _m21("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140.0),
    _m21("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148.0),
    _m21("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155.0),
    _m21("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163.0),
    _m21("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163.0),
)

# --- BLOOM-176B on A100-80GB (Jean Zay) ------------------------------------------------------

BLOOM = Run(
    name="bloom-176B",
    model="gpt",
    kwargs=_gpt(70, 14336, 112, 250880, 2048),
    device="a100-80gb",
    dtype="bf16",
    link="jean-zay",
    gpus=384,
    t=4,
    p=12,
    d=8,
    vp=1,
    mbs=2,
    global_batch=2048,
    seq=2048,
    recompute="full",
    sharding="zero1",
    sequence_parallel=False,
    figure=149.77,
    unit=TFLOPS,
    flops=HW,
    source=(
        "bigscience-workshop/bigscience train/tr11-176B-ml/README.md (git 9e64edec): 48 nodes of 8 A100 80GB, "
        "TP 4 PP 12 DP 8 MBS 2, GBS 2048 x 2048 tokens, 70 layers of 14336, 112 heads, vocabulary 250,680 "
        "(250,880 padded), DeepSpeed activation checkpointing, ZeRO-1 (its BF16_Optimizer), 4 Omni-Path links per "
        "node; iteration 85376: 104.70 s, 149.77 TFLOPs, counted 'with the 4*2 coefficient' (hardware)"
    ),
    unpublished="DeepSpeed's pipeline engine runs 1F1B (its TrainSchedule; no interleaving): pinned",
    unverified=(
        "the Omni-Path rate (100 Gb/s, the architecture's; the README gives the link count); ALiBi priced as a "
        "learned position table (29 M parameters); the BLOOM paper (Le Scao et al. 2022) not read here"
    ),
    also="104.70 s per step",
    attention=UNFUSED,
    dp_overlap=False,
    loss_fusion=False,
)

# --- Megatron-Core r0.8.0 on H100 (Megatron-LM README) ---------------------------------------

MCORE = (
    "Megatron-LM README, Performance Benchmarking, images/model_table.png (git d98e8a64; Megatron-Core r0.8.0 as "
    "its scaling figures say): heads, hidden size, layers, t, p, d, GPUs, batch, TFLOP/s and MFU per GPU; "
    "vocabulary 131,072, 4,096 tokens; --overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap"
)
MCORE_UNVERIFIED = (
    "bf16 (MFU = TFLOP/s / 989); untied embeddings (from the parameter counts); the loss unfused (r0.8.0's "
    "default; --cross-entropy-loss-fusion not named); the distributed optimizer "
    "(--overlap-param-gather needs it) and sequence parallelism (--tp-comm-overlap needs it); the cluster's "
    "network (NDR 400 Gb/s x 8 assumed: 'H100 clusters')"
)


def _mcore(name: str, heads: int, hidden: int, layers: int, t: int, p: int, gpus: int, batch: int, tf: float) -> Run:
    return Run(
        name=f"mcore-{name}",
        model="gpt",
        kwargs=_gpt(layers, hidden, heads, 131072, 4096, tied=False),
        device="h100",
        dtype="bf16",
        link="dgx-h100",
        gpus=gpus,
        t=t,
        p=p,
        d=48,
        vp=None,
        mbs=None,
        global_batch=batch,
        seq=4096,
        recompute="unknown",
        sharding="zero1",
        sequence_parallel=t > 1,
        figure=tf,
        unit=TFLOPS,
        flops=MODEL,
        source=MCORE,
        unpublished="micro-batch, interleaving and recomputation: searched (Megatron's schedules, uniform recompute)",
        unverified=MCORE_UNVERIFIED,
        tp_comm_overlap=True,
        loss_fusion=False,
    )


MEGATRON_CORE = (
    _mcore("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    _mcore("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    _mcore("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
    _mcore("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    _mcore("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
    _mcore("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    _mcore("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    _mcore("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    _mcore("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
)

# --- Nemotron-4 340B on H100 (its technical report) ------------------------------------------

NEMOTRON4 = (
    "Nemotron-4 340B Technical Report (NVIDIA 2024, arXiv 2406.11704), Table 2, read through Epoch AI's note "
    "(aiportalx.com/nvidia/nemotron-4-340b: 6,144 H100, batch 2304, 8.0 s per iteration, MFU 41-42%), the model "
    "card (batch 2304 x 4096 tokens) and a summary (8-way TP, 12-way PP with interleaving, DP; 768 DGX H100 nodes)"
)
NEMOTRON4_UNPUBLISHED = "micro-batch, virtual stages and recomputation: searched (interleaved 1F1B)"
NEMOTRON4_UNVERIFIED = (
    "bf16 (MFU against 989 TFLOP/s, Epoch AI's reading); the distributed optimizer (recalled, not found stored); "
    "sequence parallelism assumed; the 400 Gb/s x 8 InfiniBand of its DGX H100 nodes (recalled)"
)


def _nemotron4(d: int, batch: int, step: float, mfu: float, verified: bool) -> Run:
    ramp = "" if verified else "; this ramp-up row (d, batch, step, MFU) as the issue gives it: not in a stored copy"
    return Run(
        name=f"nemotron4-340B-{96 * d}",
        model="llama",
        kwargs=(("preset", "nemotron4-340b"),),
        device="h100",
        dtype="bf16",
        link="dgx-h100",
        gpus=96 * d,
        t=8,
        p=12,
        d=d,
        vp=None,
        mbs=None,
        global_batch=batch,
        seq=4096,
        recompute="unknown",
        sharding="zero1",
        sequence_parallel=True,
        figure=step,
        unit=STEP,
        flops=MODEL,
        source=NEMOTRON4,
        unpublished=NEMOTRON4_UNPUBLISHED,
        unverified=NEMOTRON4_UNVERIFIED + ramp,
        verified=verified,
        also=f"MFU {mfu}% (model FLOPs)",
    )


NEMOTRON4_340B = (
    _nemotron4(16, 768, 10.3, 42.4, verified=False),
    _nemotron4(32, 1536, 10.3, 42.3, verified=False),
    _nemotron4(64, 2304, 8.0, 41.0, verified=True),
)

# --- Llama 3 405B on H100 (Meta) -------------------------------------------------------------

LLAMA3 = (
    "Grattafiori et al. 2024, 'The Llama 3 Herd of Models', Table 4, as Balaji's SC'24 slide shows it (quoted at "
    "glennklockwood.com/garden/llama-3.1): GPUs, TP 8, CP 1, PP 16, 16M tokens per batch, TFLOP/s per GPU; "
    "8K-token pre-training; RoCE at 400 Gb/s between GPUs (ai-papers.xuzou.cn/papers/llama3_2024); d = GPUs / 128; "
    "Sec. 3.3.2 (as recalled: no stored copy of its text was found) for the pipeline and the sharding, below"
)
# What Sec. 3.3.2 of the paper says of the 8K-token pre-training, as the rows below pin it (recalled; the
# stored pages hold the paper's opening and Table 4's figures, not this section's text):
# - "we reduce one Transformer layer each from the first and the last stages ... the first model chunk on the
#   first stage has only the embedding, and the last model chunk on the last stage has only output projection
#   and loss calculation", with an interleaved schedule of V chunks a rank ("bubble ratio (PP - 1) / (V M)"):
#   each stage owns V one-layer chunks but the two ends, so 16 V - 2 = 126 layers, V = 8 (with chunks of two
#   layers or more, removing one layer would not leave the first chunk the embedding alone);
# - "we could pre-train Llama 3 on sequences of 8K tokens without activation checkpointing": no recomputation;
# - FSDP "shards the optimizer states and gradients, but for model shards we do not reshard after forward
#   computation", with "FP32 gradient accumulation during backward computation over multiple micro-batches"
#   and to "reduce-scatter gradients in FP32": the weights gathered once a step and kept, the gradients
#   accumulated whole and reduce-scattered once a step (SHARDING's "fsdp-step"), not each micro-batch (zero2).


def _llama3(gpus: int, tf: float, mfu: int) -> Run:
    return Run(
        name=f"llama3-405B-{gpus}",
        model="llama",
        kwargs=(("preset", "llama3.1-405b"),),
        device="h100",
        dtype="bf16",
        link="meta-roce",
        gpus=gpus,
        t=8,
        p=16,
        d=gpus // 128,
        vp=8,  # Sec. 3.3.2's balanced ends: 16 x 8 chunks, one layer each but the embedding's and the head's
        mbs=None,
        global_batch=2048,
        seq=8192,
        recompute="none",  # Sec. 3.3.2: 8K tokens "without activation checkpointing"
        sharding="fsdp-step",  # Sec. 3.3.2: weights not resharded, fp32 gradients reduce-scattered after accumulating
        sequence_parallel=True,
        figure=tf,
        unit=TFLOPS,
        flops=MODEL,
        source=LLAMA3,
        unpublished=(
            "micro-batch: searched; V not given as a number (8 from Sec. 3.3.2's balance: 16 V - 2 = 126 layers); "
            "sequence parallelism assumed; Meta's schedule (tunable N contiguous micro-batches) priced as Megatron's "
            "interleaved 1F1B, whose bubble is the paper's (PP - 1) / (V M)"
        ),
        unverified=(
            f"BF16 MFU {mfu}% and batch per replica (the paper's Table 4 as recalled; d x batch x 8192 = 16M agrees); "
            "Sec. 3.3.2 as recalled: the balanced first and last stages, no activation checkpointing at 8K, FSDP "
            "sharding optimizer state and gradients but not resharding weights, fp32 accumulation and reduce-scatter"
        ),
        also=f"BF16 MFU {mfu}%",
    )


LLAMA3_405B = (_llama3(8192, 430.0, 43), _llama3(16384, 400.0, 41))

# --- NeMo and Megatron-Bridge performance summaries on DGX-H100 (FP8) ------------------------

NEMO = (
    "NVIDIA/NeMo docs/source/performance/performance_summary.md (git d31653f7; NeMo 24.07 container, DGX-H100, FP8): "
    "#GPUs, GBS, MBS, sequence, TP, PP, CP, VP, tokens/s and model TFLOP/s per GPU"
)
NEMO_CSV = (
    "recomputation none, as NeMo's scripts/performance/recommended_model_configs/model_configs_h100.csv (git "
    "8cfedd72, a later NeMo) has for this layout; "
)
NEMO_ASSUMED = (
    "the distributed optimizer and sequence parallelism: NeMo's performance recipes' defaults, assumed; the "
    "gradients reduced in bf16 (NeMo 2.0's performance scripts with FP8: grad_reduce_in_fp32 = False), assumed"
)


def _nemo(
    name: str,
    preset: str,
    gpus: int,
    gbs: int,
    mbs: int,
    seq: int,
    t: int,
    p: int,
    vp: int,
    tokens: float,
    tf: float,
    recompute: str,
    source: str = NEMO,
    sharding: str = "zero1",
) -> Run:
    return Run(
        name=name,
        model="gpt" if preset.startswith("gpt") else "llama",
        kwargs=(("preset", preset),),
        device="h100",
        dtype="fp8",
        link="dgx-h100",
        gpus=gpus,
        t=t,
        p=p,
        d=gpus // (t * p),
        vp=vp,
        mbs=mbs,
        global_batch=gbs,
        seq=seq,
        recompute=recompute,
        sharding=sharding,
        sequence_parallel=t > 1,
        figure=tokens,
        unit=TOKENS,
        flops=MODEL,
        source=source,
        unpublished=(NEMO_CSV if recompute == "none" else "recomputation: searched; ") + NEMO_ASSUMED,
        also=f"{tf:.0f} model TFLOP/s per GPU",
        grad_reduce_fp32=False,
    )


BRIDGE = (
    "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md (git 067f987d), DGX-H100, FP8 (current "
    "scaling): #GPUs, GBS, MBS, sequence, FSDP, TP, PP, CP, VP, tokens/s and model TFLOP/s per GPU"
)
GPT3 = "gpt3-175b"
NEMO_FP8 = (
    _nemo("nemo-gpt3-175B-128", GPT3, 128, 256, 1, 2048, 4, 8, 6, 726, 782, "none"),
    _nemo("nemo-gpt3-175B-512", GPT3, 512, 2048, 2, 2048, 4, 8, 6, 782, 842, "none"),
    _nemo("nemo-llama2-70B-64", "llama2-70b", 64, 128, 1, 4096, 4, 4, 20, 1707, 759, "unknown"),
    _nemo("nemo-llama2-13B-16", "llama2-13b", 16, 128, 1, 4096, 1, 4, 10, 8646, 754, "unknown"),
    _nemo("nemo-llama2-7B-8", "llama2-7b", 8, 128, 1, 4096, 1, 1, 1, 16847, 776, "unknown"),
    _nemo("nemo-nemotron4-340B-128", "nemotron4-340b", 128, 32, 1, 4096, 8, 8, 12, 322, 678, "none"),
    _nemo(
        "bridge-llama3-70B-64",
        "llama3-70b",
        64,
        256,
        1,
        8192,
        4,
        8,
        5,
        1664,
        731,
        "none",
        BRIDGE + " (26.04.01 container)",
    ),
    _nemo(
        "bridge-llama3-8B-8",
        "llama3-8b",
        8,
        128,
        1,
        8192,
        1,
        1,
        1,
        14451,
        744,
        "none",
        BRIDGE + " (25.11 container; FSDP over the 8 GPUs)",
        sharding="fsdp",
    ),
)

BRIDGE_MOE = (
    "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md (stored copy at git 0a25f911), "
    "DGX-H100: #GPUs, GBS, MBS, sequence, FSDP 0, TP, PP, CP, VP, EP, GA, tokens/s and model TFLOP/s per GPU; "
    "'we force-balance the token distribution among experts and all benchmarks are token-dropless'"
)
BRIDGE_MOE_ASSUMED = (
    "the distributed optimizer (ZeRO-1) and Megatron's overlaps assumed but where the recipe says otherwise; "
    "the MoE all-to-all overlap searched (Megatron's interleaved overlap, which both H100 recipes turn on: "
    "overlap_moe_expert_parallel_comm with delay_wgrad_compute); the CUDA_DEVICE_MAX_CONNECTIONS the "
    "DeepSeek-V3 run launched with (25.09's NeMo-Run plugin) not verified"
)
# What the two H100 MoE runs ran with, read from the performance scripts of the release that published
# each figure (github.com/NVIDIA-NeMo/Megatron-Bridge, tags as named; line numbers at those tags):
# - DeepSeek-V3, v0.1.0rc4 (25.09): scripts/performance/run_script.py:56 enable_deepep on the H100 (the
#   recipe, src/megatron/bridge/recipes/deepseek/deepseek_v3.py:147, then sets moe_token_dispatcher_type
#   "flex", moe_enable_deepep), :62 A2A_1F1B on the H100 and :82-85 overlap_moe_expert_parallel_comm,
#   delay_wgrad_compute on, moe_shared_expert_overlap off; :78 moe_router_force_load_balancing; :91
#   recompute_modules mla_up_proj, mlp (the yaml's recompute_granularity "selective"); :101-102
#   comm_overlap.overlap_grad_reduce False on the H100 (the parameter gather stays overlapped,
#   training/comm_overlap.py's default where d > 1): Run.grad_overlap; cuda_graphs false
#   (configs/deepseek/deepseek_v3_llm_pretrain.yaml:66); tp_comm_overlap off (the recipe's default
#   CommOverlapConfig); moe_permute_fusion on (deepseek_v3.py:109).
# - Qwen3-235B-A22B, v0.3.0 (26.02): configs/qwen/qwen3_workload_base_configs.py:171-180 (H100 FP8_CS
#   V1; V2, :268-271, GBS 8192) moe_a2a_overlap=True, which utils/overrides.py:148-155 turns into
#   overlap_moe_expert_parallel_comm, delay_wgrad_compute on, moe_shared_expert_overlap off;
#   configs/qwen/qwen3_llm_pretrain.py:184 tp_comm_overlap False, no flex backend (Megatron-Core's
#   alltoall dispatcher, models/qwen/qwen_provider.py:395-397, grouped GEMM, permute fusion), no CUDA
#   graphs, recompute_granularity None; perf_plugins.py:228-246 CUDA_DEVICE_MAX_CONNECTIONS 8 on the H100
#   with the overlap (1 only without it).
# Megatron-LM (core_v0.14.0, megatron/training/arguments.py:862-870) warns that on Hopper tensor
# parallelism and this overlap want different CUDA_DEVICE_MAX_CONNECTIONS, and both runs use t = 2; it
# gives no figure for the cost, so none is priced. Priced from the source: the warm-up forwards and
# cool-down backwards the combined 1F1B cannot pair (core_v0.14.0 pipeline_parallel/schedules.py:725-739,
# planner.cluster.experts.Unpaired) and DeepSeek-V3's gradient reduction in the open.
# The recomputation each published run ran, from the performance scripts of the Megatron-Bridge
# release that published its figure (github.com/NVIDIA-NeMo/Megatron-Bridge):
# - DeepSeek-V3, 25.09 container (v0.1.0rc4, whose docs/performance-summary.md has the 1,297 row):
#   scripts/performance/configs/deepseek/deepseek_v3_llm_pretrain.yaml sets recompute_granularity
#   "selective" and scripts/performance/run_script.py, for the H100, recompute_modules
#   ["mla_up_proj", "mlp"] (Megatron-Core recomputes mlp in the dense layers only, not in MoE layers).
# - Qwen3-235B-A22B, 26.02 container (v0.3.0, whose performance summary has the 1,633 row):
#   scripts/performance/configs/qwen/qwen3_llm_pretrain.py, set_qwen3_common_configs, sets
#   recompute_granularity None: nothing recomputed.
# The dispatcher: scripts/performance/run_script.py (25.09, v0.1.0rc4) turns DeepEP on for DeepSeek-V3 on
# the H100 (enable_deepep, with overlap_moe_expert_parallel_comm and delay_wgrad_compute); its model,
# DeepSeekV3Provider, routes each token to moe_router_group_topk 4 of moe_router_num_groups 8 groups of
# 32 experts, one group per node at EP 64 (4 experts per rank, 8 ranks per node): at most 4 nodes. The
# Qwen3 H100 recipe (26.02) sets no flex dispatcher: Megatron-Core's all-to-all (NCCL), no SM figure.
# DeepEP's kernels hold 20 SMs in Megatron-Core (megatron/core/transformer/moe/token_dispatcher.py:
# "None -> 20 (DeepEP's historical mcore default when moe_flex_dispatcher_num_sms is unset)") of the
# H100 SXM's 132 (NVIDIA H100 Tensor Core GPU Architecture whitepaper).
DEEPEP_SMS = 20
# DeepSeek-V3's own all-to-all kernels beside DualPipe's computation: "only 20 SMs are sufficient to fully
# utilize the bandwidths of IB and NVLink" (technical report, Sec. 3.2.2), of the H800's 132
DEEPSEEK_SMS = 20
DEVICE_SMS = {"h100": 132, "h800": 132}
DEEPSEEK_RECOMPUTE = ("selective", ("mla_up_proj", "mlp"))
QWEN3_RECOMPUTE = ("none", ())


def _bridge_moe(
    name: str,
    preset: str,
    gpus: int,
    gbs: int,
    t: int,
    p: int,
    vp: int,
    ep: int,
    tokens: float,
    tf: float,
    src: str,
    recompute: tuple[str, tuple[str, ...]],
    deepep_nodes: int | None = None,
    grad_overlap: bool = True,
) -> Run:
    return Run(
        name=name,
        model="moe",
        kwargs=(("preset", preset),),
        device="h100",
        dtype="fp8",
        link="dgx-h100",
        gpus=gpus,
        t=t,
        p=p,
        d=gpus // (t * p),
        vp=vp,
        mbs=1,
        global_batch=gbs,
        seq=4096,
        recompute=recompute[0],
        sharding="zero1",
        sequence_parallel=t > 1,
        figure=tokens,
        unit=TOKENS,
        flops=MODEL,
        source=f"{BRIDGE_MOE} ({src})",
        unpublished=BRIDGE_MOE_ASSUMED,
        also=f"{tf:.0f} model TFLOP/s per GPU",
        ep=ep,
        grad_reduce_fp32=False,
        recompute_modules=recompute[1],
        deepep=deepep_nodes is not None,
        max_nodes=deepep_nodes or 0,
        grad_overlap=grad_overlap,
    )


MOE = (
    # 25.09 container, 'DeepSeekV3 (dropless)': 1,024 GPUs, GBS 8192, MBS 1, 4096 tokens, TP 2 PP 8 CP 1
    # VP 4 EP 64, GA 128: 1,297 tokens/s and 338 (330 with DeepSeek's 128x128 FP8 blocks) TFLOP/s per GPU
    _bridge_moe(
        "bridge-deepseek-v3-1024",
        "deepseek-v3",
        1024,
        8192,
        2,
        8,
        4,
        64,
        1297,
        338,
        "25.09 container",
        DEEPSEEK_RECOMPUTE,
        deepep_nodes=4,
        grad_overlap=False,
    ),
    # 26.02 container, FP8: 256 GPUs, GBS 8192, MBS 1, 4096 tokens, TP 2 PP 8 CP 1 VP 4 EP 32: 1,633
    # tokens/s and 242 TFLOP/s per GPU (the 'about 253', 26.04.01, is not in the stored copy)
    _bridge_moe(
        "bridge-qwen3-235B-256",
        "qwen3-235b-a22b",
        256,
        8192,
        2,
        8,
        4,
        32,
        1633,
        242,
        "26.02 container",
        QWEN3_RECOMPUTE,
    ),
)

RUNS: tuple[Run, ...] = (
    *MEGATRON_2021,
    BLOOM,
    *MEGATRON_CORE,
    *NEMOTRON4_340B,
    *LLAMA3_405B,
    *NEMO_FP8,
    *MOE,
)

# One row per device type and dtype sets its compute efficiency (DeviceSpec.compute_scaled, one step);
# chosen before any prediction was seen: the middle row of the first table of that device and dtype
# (Megatron-LM 2021's 39.1B, as bench_megatron.py; Megatron-Core's 70B, 5th of 9), and for FP8 the
# project's reference case, GPT-3 175B (NeMo's first large FP8 row). Every other row is held out.
CALIBRATION = {
    ("a100-80gb", "bf16"): "m21-39.1B",
    ("h100", "bf16"): "mcore-70B",
    ("h100", "fp8"): "nemo-gpt3-175B-128",
}
