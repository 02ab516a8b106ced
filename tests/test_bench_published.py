"""bench/bench_published.py and its rows (bench/published_runs.py): the rows are consistent with
their own models, the published layout maps onto the planner's choices as documented, figures
are compared in the source's unit, and a small run prints a row and the statistics line."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from autopipe.modes import Recompute, Sharding
from autopipe.plans import Plan

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "bench_published.py"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # the bench imports its rows as a sibling
    import bench_published
    import published_runs

    return bench_published, published_runs


def test_every_row_names_a_model_config_at_its_sequence_and_its_source(bench: tuple[ModuleType, ModuleType]) -> None:
    _, rows = bench
    assert len({r.name for r in rows.RUNS}) == len(rows.RUNS)
    for run in rows.RUNS:
        config = _model_file(run.model).make_config(**run.model_kwargs)  # the model file's own checks
        assert config.block_size == run.seq, run.name
        assert run.source and run.link in rows.LINKS and run.gpus == run.t * run.p * run.d * run.cp
        assert run.cp == 1, f"{run.name}: context parallelism is for later (issue 25), listed in the docstring"


@functools.cache
def _model_file(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_published_{name}", ROOT / "models" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_calibration_row_per_device_and_dtype(bench: tuple[ModuleType, ModuleType]) -> None:
    _, rows = bench
    for (device, dtype), name in rows.CALIBRATION.items():
        run = rows.by_name(name)
        assert (run.device, run.dtype) == (device, dtype) and run.verified
    families = {r.family for r in rows.RUNS}
    assert set(rows.CALIBRATION) <= families


def test_a_bad_row_is_one_line(bench: tuple[ModuleType, ModuleType]) -> None:
    _, rows = bench
    run = rows.by_name("bloom-176B")
    with pytest.raises(ValueError, match=r"bloom-176B: t x p x d x cp = 384, not 385"):
        dataclasses.replace(run, gpus=385)
    with pytest.raises(ValueError, match="does not split into 8 x 3"):
        dataclasses.replace(run, mbs=3)
    with pytest.raises(KeyError, match="no published run 'gpt-5'"):
        rows.by_name("gpt-5")


def test_layout_choices_say_what_the_planner_is_told(bench: tuple[ModuleType, ModuleType]) -> None:
    b, rows = bench
    bloom = b.layout_choices(rows.by_name("bloom-176B"))  # vp 1, mbs 2, full, ZeRO-1, no SP
    assert (bloom.tensor_parallel, bloom.stages, bloom.data_parallel) == (4, 12, 8)
    assert bloom.choices.schedule == "1f1b" and bloom.choices.micro_batches == 2048 // (8 * 2)
    assert bloom.choices.recompute == Recompute.ALWAYS and bloom.shard_optimizer and not bloom.sequence_parallel
    assert bloom.choices.target == "megatron" and bloom.approximated == ()
    gpt3 = b.layout_choices(rows.by_name("nemo-gpt3-175B-128"))  # vp 6: interleaved, none recomputed
    assert (gpt3.choices.schedule, gpt3.choices.virtual, gpt3.choices.recompute) == (
        "interleaved-1f1b",
        6,
        Recompute.NEVER,
    )
    # Llama 3 (Sec. 3.3.2): interleaved, V = 8 (16 x 8 chunks = 126 layers + the embedding's + the head's),
    # no recomputation at 8K tokens, FSDP gathering once a step priced as ZeRO-1; the micro-batch searched
    llama = b.layout_choices(rows.by_name("llama3-405B-8192"))
    assert (llama.choices.schedule, llama.choices.virtual, llama.choices.micro_batches, llama.choices.recompute) == (
        "interleaved-1f1b",
        8,
        None,
        Recompute.NEVER,
    )
    assert llama.shard_optimizer and llama.sharding == Sharding.ZERO1
    assert llama.approximated == (
        "FSDP gathering once a step priced as the distributed optimizer (ZeRO-1: the same state and collectives, "
        "planner/placement.py's zero3-step; its reductions in Megatron's buckets)",
    )
    assert b.layout_choices(dataclasses.replace(rows.by_name("m21-1T"), sharding="zero2")).sharding == Sharding.ZERO2
    assert bloom.sharding == Sharding.ZERO1 and b.layout_choices(rows.by_name("m21-1T")).sharding is None
    assert b.layout_choices(rows.by_name("bridge-llama3-8B-8")).sharding == Sharding.ZERO3  # FSDP
    selective = b.layout_choices(dataclasses.replace(rows.by_name("m21-1T"), recompute="selective", sharding="fsdp"))
    assert selective.choices.recompute == Recompute.NEVER and len(selective.approximated) == 1
    assert selective.sharding == Sharding.ZERO3
    # the MoE rows' recomputation as their recipes ran it: DeepSeek-V3's modules pinned, Qwen3's none
    deepseek = b.layout_choices(rows.by_name("bridge-deepseek-v3-1024"))
    assert deepseek.choices.recompute_modules == ("mla_up_proj", "mlp") and deepseek.approximated == ()
    assert deepseek.choices.recompute == Recompute.AUTO  # selective: no stage recomputed whole
    qwen3 = b.layout_choices(rows.by_name("bridge-qwen3-235B-256"))
    assert (qwen3.choices.recompute, qwen3.choices.recompute_modules) == (Recompute.NEVER, None)
    with pytest.raises(ValueError, match="recompute modules"):
        dataclasses.replace(rows.by_name("bloom-176B"), recompute_modules=("mlp",))


def test_rows_say_whether_they_reduced_their_gradients_in_fp32(bench: tuple[ModuleType, ModuleType]) -> None:
    """Megatron-LM with --bf16 (the Megatron-Core table, Nemotron-4), DeepSpeed's BF16_Optimizer (BLOOM) and
    Meta (Llama 3) reduce in fp32; the fp16 2021 runs and NeMo's FP8 recipes in the weights' dtype."""
    _, rows = bench
    fp32 = {r.name for r in rows.RUNS if r.grad_reduce_fp32}
    assert {"mcore-70B", "bloom-176B", "nemotron4-340B-6144", "llama3-405B-8192"} <= fp32
    assert not fp32 & {r.name for r in rows.RUNS if r.name.startswith("m21-") or r.dtype == "fp8"}


def test_the_run_says_how_it_attended_and_what_it_overlapped(bench: tuple[ModuleType, ModuleType]) -> None:
    b, rows = bench
    assert {r.attention for r in rows.RUNS if r.name.startswith(("m21-", "bloom"))} == {"unfused"}
    assert {r.attention for r in rows.RUNS if not r.name.startswith(("m21-", "bloom"))} == {"flash"}
    assert b.FUSED  # every row ran Megatron-LM's fused kernels: the megatron target's
    mcore = b.overlap_of(rows.by_name("mcore-70B"))  # --tp-comm-overlap at t = 8: 7 of 8 chunks hidden
    assert (mcore.tp_comm, mcore.grad_reduce, mcore.param_gather) == (0.875, True, True)
    assert b.overlap_of(rows.by_name("mcore-1.7B")).tp_comm == 0.0  # t = 1: nothing to hide
    assert b.overlap_of(rows.by_name("llama3-405B-8192")).tp_comm == 0.0  # the source does not say
    for name in ("m21-39.1B", "bloom-176B"):  # the gradients all-reduced after the pipeline, in 2021 and 2022
        serial = b.overlap_of(rows.by_name(name))
        assert not (serial.grad_reduce or serial.param_gather or serial.tp_comm), name
    # DeepSeek-V3's H100 recipe turned the gradient reduction's overlap off, not the gather's (v0.1.0rc4
    # scripts/performance/run_script.py); Qwen3's kept Megatron's defaults
    deepseek = b.overlap_of(rows.by_name("bridge-deepseek-v3-1024"))
    assert (deepseek.grad_reduce, deepseek.param_gather) == (False, True)
    qwen3 = b.overlap_of(rows.by_name("bridge-qwen3-235B-256"))
    assert (qwen3.grad_reduce, qwen3.param_gather) == (True, True)
    assert all(r.grad_overlap for r in rows.RUNS if r.name != "bridge-deepseek-v3-1024")
    with pytest.raises(ValueError, match="attention 'sdpa' is neither flash nor unfused"):
        dataclasses.replace(rows.by_name("m21-1T"), attention="sdpa")


def test_the_moe_rows_price_the_dispatcher_their_recipes_ran(
    bench: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    b, rows = bench
    seen: dict[str, object] = {}
    monkeypatch.setattr(b, "counts_of", lambda run: None)
    monkeypatch.setattr(b, "parallel_options", lambda counts, spec, links, **kw: seen.update(kw))
    spec = b.device_spec("h100")
    b.options_of(rows.by_name("bridge-deepseek-v3-1024"), spec, True)  # DeepEP on the H100 (v0.1.0rc4)
    assert (seen["deduplicate"], seen["max_nodes"], seen["alltoall_share"]) == (True, 4, 20 / 132)
    seen.clear()
    b.options_of(rows.by_name("bridge-qwen3-235B-256"), spec, True)  # Megatron-Core's all-to-all: no figure
    assert "alltoall_share" not in seen and "deduplicate" not in seen


def test_unpublished_virtual_stages_are_the_ones_megatron_runs(bench: tuple[ModuleType, ModuleType]) -> None:
    b, rows = bench
    assert b.virtuals(rows.by_name("m21-529.6B")) == (3,)  # 105 layers / 35 stages: 3 a device
    assert b.virtuals(rows.by_name("nemotron4-340B-6144")) == (2, 4, 8)  # 96 / 12 = 8, at most MAX_VIRTUAL
    assert b.virtuals(rows.by_name("llama3-405B-8192")) == ()  # published as Sec. 3.3.2 balances it (v 8)
    assert b.virtuals(dataclasses.replace(rows.by_name("llama3-405B-8192"), vp=None)) == ()  # 126 / 16: no whole number
    assert b.virtuals(rows.by_name("nemo-gpt3-175B-128")) == ()  # published (vp 6)
    assert b.virtuals(rows.by_name("mcore-1.7B")) == ()  # no pipeline


def test_figures_are_compared_in_the_sources_unit(bench: tuple[ModuleType, ModuleType]) -> None:
    b, rows = bench
    plan = Plan.load(ROOT / "tests" / "fixtures" / "good_mlp_plan_v1.json")
    plan = dataclasses.replace(plan, iteration_time_s=2.0, allreduce_s=0.0, model_flops=6e18, hardware_flops=8e18)
    bloom = dataclasses.replace(rows.by_name("bloom-176B"), figure=100.0)  # hardware TFLOP/s, 384 GPUs
    assert b.predicted_figure(bloom, plan) == pytest.approx(8e18 / 2.0 / 384 / 1e12)
    assert b.error(bloom, 110.0) == pytest.approx(0.10)
    nemotron = rows.by_name("nemotron4-340B-6144")  # 8.0 s per step: a slower prediction is an under-prediction
    assert b.predicted_figure(nemotron, plan) == 2.0 and b.error(nemotron, 10.0) == pytest.approx(-0.2)
    gpt3 = rows.by_name("nemo-gpt3-175B-128")  # tokens/s per GPU: 256 x 2048 tokens over 128 GPUs
    assert b.predicted_figure(gpt3, plan) == pytest.approx(256 * 2048 / 2.0 / 128)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_small_run_prints_its_row_and_the_statistics(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", "m21-1.7B", "--no-free", "--write-plans", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=290,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("calibrated a100-80gb bf16 on m21-39.1B: x")
    row = next(line for line in lines if line.startswith("| m21-1.7B |"))
    assert "| 137.0 TFLOP/s per GPU |" in row and "held out, hardware FLOPs" in row and "(Selene)" in row
    assert re.fullmatch(r"held-out rows: 1, median \|error\| \d+\.\d%, worst [+-]\d+\.\d%", lines[-1])
    plan = Plan.load(tmp_path / "m21-1.7B.json")
    assert (plan.tensor_parallel, plan.devices, plan.data_parallel) == (1, 1, 32)
    assert all(s.recompute for s in plan.stages)


def test_no_matching_row_is_one_line(
    bench: tuple[ModuleType, ModuleType], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    b, _ = bench
    monkeypatch.setattr(sys, "argv", ["bench_published.py", "--rows", "gpt-5"])
    assert b.main() == 2
    assert capsys.readouterr().err == "bench_published: no run matches --rows 'gpt-5'\n"


def test_megatrons_unfused_loss_is_counted_where_it_ran(bench: tuple[ModuleType, ModuleType]) -> None:
    """Megatron-LM 2021, Megatron-DeepSpeed (BLOOM) and Megatron-Core r0.8.0 computed the loss with the
    unfused vocab_parallel_cross_entropy (--cross-entropy-loss-fusion is opt-in); the others keep the
    fused kernel. Counted so, the loss's kernels are marked eager and its fp32 softmax is saved."""
    b, rows = bench
    unfused = {r.name for r in rows.RUNS if not r.loss_fusion}
    assert unfused == {r.name for r in rows.RUNS if r.name.startswith(("m21-", "bloom", "mcore-"))}
    counts = b.counts_of(rows.by_name("mcore-1.7B"))
    last = counts.counts[0][-1]
    assert any(op.kind == "eager" for op in last.forward)
    fused = b.counts_of(dataclasses.replace(rows.by_name("mcore-1.7B"), loss_fusion=True)).counts[0][-1]
    assert not any(op.kind == "eager" for op in fused.forward)
    assert last.saved_bytes > fused.saved_bytes  # 4 bytes a logit (fp32) where torch's saves 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_llama3_pins_metas_balanced_interleaving(bench: tuple[ModuleType, ModuleType]) -> None:
    """Llama 3 405B as Sec. 3.3.2 of its paper runs it: 16 ranks x 8 chunks = 128 chunks for 126 layers, the
    first chunk the embedding alone and the last the head alone (the first and last stages one layer short),
    every other chunk one layer; 2048 sequences over 64 replicas, 32 micro-batches of one; nothing recomputed."""
    b, rows = bench
    run = rows.by_name("llama3-405B-8192")
    plan = b.plan_pinned(run, b.device_spec(run.device)).plan
    assert (plan.schedule, plan.virtual, plan.micro_batches, plan.micro_batch_size) == ("interleaved-1f1b", 8, 32, 1)
    assert len(plan.stages) == 16 * 8 and not any(s.recompute for s in plan.stages)
    assert [s.rank for s in plan.stages] == [j % 16 for j in range(128)]  # chunk j on rank j mod 16
    assert plan.stages[0].blocks == ("embed_tokens",) and plan.stages[-1].blocks == ("norm", "lm_head")
    assert [s.blocks for s in plan.stages[1:-1]] == [(f"layers.{i}",) for i in range(126)]
