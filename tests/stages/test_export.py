"""autopipe.stages.export: plans as torch.distributed.pipelining stages and schedules (2 gloo
ranks: export_worker.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from autopipe.errors import PlanError
from autopipe.model.load import call_model
from autopipe.plans import Plan
from autopipe.stages import export
from autopipe.stages.export import pipeline_inputs, relay_stages, to_torch_pipelining
from autopipe.stages.rebuild import rebuild_model, trace_for_plan
from autopipe.stages.split import split_model
from tests.helpers import FIXTURES, even_plan, reference_training, wait_ranks
from tests.stages import hf_export_worker, tied_worker
from tests.stages.export_worker import CONFIGS, LR, STEPS, plan_for

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reference(name: str, world: int) -> dict[str, torch.Tensor]:
    plan = plan_for(name, world)
    loaded = rebuild_model(plan)
    model = loaded.model
    x, y = loaded.make_inputs(plan.batch_size), loaded.make_targets(plan.batch_size)  # type: ignore[misc]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    m = plan.micro_batches
    for _ in range(STEPS):
        optimizer.zero_grad()
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            (loaded.loss_fn(model(xi), yi) / m).backward()
        optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def _run_ranks(worker: str, world: int, out: Path, *extra: str, timeout: float = 150) -> list[dict[str, object]]:
    """Start ``world`` gloo ranks of ``worker`` (killed after ``timeout`` s); what each saved."""
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1]), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / worker), str(r), str(world), port, str(out / f"rank{r}.pt"), *extra],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    wait_ranks(procs, timeout)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(world)]


@pytest.mark.slow
def test_two_rank_training_matches_one_process(tmp_path: Path) -> None:
    world = 2
    got = _run_ranks("export_worker.py", world, tmp_path)
    for name in CONFIGS:
        want = _reference(name, world)
        seen = set()
        for r in range(world):
            for pname, value in got[r][name].items():
                diff = float((value - want[pname]).abs().max())
                assert diff <= 1e-5, (name, r, pname, diff)
                seen.add(pname)
        assert seen == set(want), (name, set(want) - seen)
        start = rebuild_model(plan_for(name, world)).model.named_parameters()
        moved = max(float((want[n] - p.detach()).abs().max()) for n, p in start)
        assert moved > 1e-3, name  # training changed the weights, so the comparison means something


@pytest.mark.parametrize(
    ("model", "stages", "virtual"),
    [("unet.py", 2, 2), ("gpt.py", 2, 2), pytest.param("resnet.py", 3, 1, marks=pytest.mark.slow)],
)
def test_relay_chain_is_the_model(model: str, stages: int, virtual: int) -> None:
    plan = even_plan(model, stages=stages, virtual=virtual)
    loaded = rebuild_model(plan)
    inputs = loaded.make_inputs(plan.micro_batch_size)
    traced = trace_for_plan(plan, loaded.model, inputs)
    relays = relay_stages(split_model(traced, plan), {n.name: i for i, n in enumerate(traced.gm.graph.nodes)})
    model_ = loaded.model.eval()
    with torch.no_grad():
        values: object = (inputs,)
        for relay in relays:
            values = relay(*values)  # type: ignore[misc]
        want = model_(inputs)
    assert torch.equal(values, want)  # type: ignore[arg-type]
    if model == "unet.py":  # the long skips ride through the middle stages
        assert len(relays[1].carry_out) > 1 and len(relays[2].carry_in) > 1


def test_bad_rank_and_fingerprint() -> None:
    plan = even_plan("mlp.py")
    loaded = rebuild_model(plan)
    with pytest.raises(PlanError, match="rank 5 is outside"):
        to_torch_pipelining(plan, loaded.model, 5, example_inputs=loaded.make_inputs(2))
    other = rebuild_model(even_plan("mlp.py", ("depth=4",)))
    with pytest.raises(PlanError, match="made for another model"):
        to_torch_pipelining(plan, other.model, 0, example_inputs=other.make_inputs(2))


@pytest.mark.parametrize("scale", [True, False])
def test_a_micro_batch_loss_reads_as_itself_and_trains_as_its_share_of_the_batch(scale: bool) -> None:
    # torch's own scale_grads divides each stage's parameters once per stage, so a parameter two
    # stages of one rank share was divided twice (tied3.py, 3 SGD steps: 12% off under interleaved
    # 1F1B, 15% under ZB-V and DualPipe-V); the loss's gradient is divided instead, once.
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = export._structured_loss(lambda out, y: ((out - y) ** 2).mean(), lambda flat: flat[0], 4, scale)
    value = loss(w * 3, torch.zeros(2))
    assert float(value.detach()) == 22.5  # the mean loss itself: (9 + 36) / 2
    value.backward()
    assert torch.equal(w.grad, torch.tensor([9.0, 18.0]) / (4 if scale else 1))  # type: ignore[arg-type]


def test_only_a_schedule_autopipe_does_not_know_is_refused_in_one_line() -> None:
    # v-half, v-min and zb-h2 have no torch class: torch runs them from the plan's schedule CSV
    # (tests/stages/test_schedule_csv.py trains them in 2 gloo ranks)
    assert {"v-half", "v-min", "zb-h2"}.isdisjoint(export.SCHEDULE_CLASSES)
    for name in ("v-half", "v-min", "zb-h2"):
        export._check_torch_schedule(SimpleNamespace(schedule=name))  # type: ignore[arg-type]
    with pytest.raises(PlanError) as info:
        export._check_torch_schedule(SimpleNamespace(schedule="pipedream"))  # type: ignore[arg-type]
    assert str(info.value).startswith(
        "schedule 'pipedream' has no torch.distributed.pipelining counterpart; plan with one of: gpipe, "
    )


def test_balance_is_blocks_per_stage() -> None:
    plan = even_plan("mlp.py", stages=3)
    assert plan.balance == tuple(len(s.blocks) for s in plan.stages)
    assert sum(plan.balance) == len({b for s in plan.stages for b in s.blocks})


HF_ARCHS = ("gpt2", "llama", "t5", "mixtral", "vit")  # decoder, GQA decoder, encoder-decoder, MoE, vision


def _hf_reference(plan: Plan) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-step losses and final weights of the unsplit model, trained on the same micro-batches."""
    loaded = rebuild_model(plan)
    model = loaded.model
    x, y = loaded.make_inputs(plan.batch_size), loaded.make_targets(plan.batch_size)  # type: ignore[misc]
    m = plan.micro_batches
    xs = [{k: v.chunk(m)[i] for k, v in x.items()} for i in range(m)] if isinstance(x, dict) else list(x.chunk(m))
    optimizer = torch.optim.SGD(model.parameters(), lr=hf_export_worker.LR)
    losses = []
    for _ in range(hf_export_worker.STEPS):
        optimizer.zero_grad()
        total = 0.0
        for xi, yi in zip(xs, y.chunk(m), strict=True):
            loss = loaded.loss_fn(call_model(model, xi), yi)
            (loss / m).backward()
            total += float(loss.detach()) / m
        optimizer.step()
        losses.append(total)
    return losses, {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.usefixtures("transformers")
def test_hugging_face_models_train_through_both_engines_as_one_process(tmp_path: Path) -> None:
    """GPT-2 (tied LM head), Llama, T5 (dict inputs, ModelOutput, non-contiguous sends),
    Mixtral (MoE) and ViT from configs: 2 gloo ranks, 3 SGD steps through to_torch_pipelining
    and through autopipe.pipeline with each engine (what ``autopipe run --engine`` runs): the
    unsplit model's per-step losses (1e-5 relative) and weights."""
    paths = []
    for arch in HF_ARCHS:
        plan = even_plan(
            str(FIXTURES / "hf_zoo.py"), {"arch": arch}, stages=2, micro_batches=2, micro_batch_size=2, reuse_trace=True
        )
        plan.save(tmp_path / f"{arch}.json")
        paths.append(str(tmp_path / f"{arch}.json"))
    got = _run_ranks("hf_export_worker.py", 2, tmp_path, *paths, timeout=400)
    for path in paths:
        plan = Plan.load(path)
        want_losses, want = _hf_reference(plan)
        names = {n for n, _ in rebuild_model(plan).model.named_parameters()}
        for way in hf_export_worker.WAYS:
            losses = got[1][(path, way)]["losses"]  # type: ignore[index]
            assert len(losses) == hf_export_worker.STEPS and losses[0] > losses[-1], (path, way, losses)
            for a, b in zip(losses, want_losses, strict=True):
                assert abs(a - b) <= 1e-5 * abs(b), (path, way, losses, want_losses)
            if way != "export":  # pipeline.step returns the batch loss on every rank
                assert got[0][(path, way)]["losses"] == losses, (path, way)  # type: ignore[index]
            held = {**got[0][(path, way)]["params"], **got[1][(path, way)]["params"]}  # type: ignore[index]
            assert set(held) <= set(want) and names <= set(held), (path, way)
            for name, value in held.items():
                assert float((value - want[name]).abs().max()) <= 1e-5, (path, way, name)


def test_pipeline_inputs_flatten_the_batch_as_the_first_stage_takes_it() -> None:
    class Stage:  # the two attributes pipeline_inputs reads of a PipelineStage
        def __init__(self, first: bool, names: tuple[str, ...]) -> None:
            self.is_first, self.submod = first, type("Relay", (), {"carry_in": names})()

    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    first = [Stage(True, ("input_ids", "attention_mask"))]
    assert pipeline_inputs(first, {"attention_mask": b, "input_ids": a}) == (a, b)  # graph order, not dict order
    assert pipeline_inputs(first, (a, b)) == (a, b)
    assert pipeline_inputs([Stage(False, ("h",))], {"input_ids": a}) == ()  # other ranks take nothing
    with pytest.raises(
        PlanError,
        match=r"the batch has no input 'attention_mask' "
        r".*give every input the model was traced with: input_ids, attention_mask",
    ):
        pipeline_inputs(first, {"input_ids": a})
    with pytest.raises(PlanError, match="the batch has 1 values where the model was traced with 2 tensor inputs"):
        pipeline_inputs(first, a)
    assert export.__all__.count("pipeline_inputs") == 1


def _docs_block(page: str, first_line: str) -> str:
    """The ```python block of docs/``page`` whose first line starts with ``first_line``, verbatim."""
    text = (HERE.parents[1] / "docs" / page).read_text()
    start = text.index("```python\n" + first_line) + len("```python")
    return text[start : text.index("```", start)]


@pytest.mark.slow
@pytest.mark.usefixtures("transformers")
def test_readme_export_script_runs_as_written_on_a_hugging_face_model(tmp_path: Path) -> None:
    """docs/outlets.md's train_pp.py (the README links it), verbatim, on 2 gloo ranks (torchrun's environment) with T5:
    dict inputs, a ModelOutput, tied embeddings; its first loss is the unsplit model's."""
    # T5's trace is the five-architecture test's (reuse_trace; this module runs on one worker)
    plan = even_plan(
        str(FIXTURES / "hf_zoo.py"), {"arch": "t5"}, stages=2, micro_batches=2, micro_batch_size=2, reuse_trace=True
    )
    plan.save(tmp_path / "gpt-2dev-plan.json")  # the file name the script loads
    (tmp_path / "train_pp.py").write_text(_docs_block("outlets.md", "# train_pp.py"))
    port = str(_free_port())
    procs = []
    for r in range(2):
        env = {
            **os.environ,
            "PYTHONPATH": str(HERE.parents[1]),
            "OMP_NUM_THREADS": "1",
            "RANK": str(r),
            "LOCAL_RANK": str(r),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "train_pp.py"],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(err[-3000:] for _, err in outs)
    lines = [line.split() for line in outs[1][0].strip().splitlines()]
    assert [int(s) for s, _ in lines] == [0, 1, 2] and outs[0][0].strip() == ""
    losses = [float(v) for _, v in lines]
    loaded = rebuild_model(plan)
    x, y = loaded.make_inputs(plan.batch_size), loaded.make_targets(plan.batch_size)  # type: ignore[misc]
    with torch.no_grad():
        halves = [
            loaded.loss_fn(call_model(loaded.model, {k: v.chunk(2)[i] for k, v in x.items()}), y.chunk(2)[i])
            for i in range(2)
        ]  # type: ignore[union-attr]
    assert abs(losses[0] - float(sum(halves)) / 2) <= 1e-5 * losses[0]
    assert losses[2] < losses[0]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_weight_three_stages_share_trains_as_one_process_under_every_schedule_and_engine(tmp_path: Path) -> None:
    """Issue 29: tied3.py's encoder embedding, decoder embedding and LM head are one Parameter; cut
    into 4 stages on 2 ranks, one rank holds two of its three users under every schedule. Through
    autopipe.pipeline (both engines) and to_torch_pipelining in the docs' loop, 3 SGD steps: the unsplit
    model's losses and weights, the tied one included, within 1e-6 relative; and so with each batch
    stepped twice through the pipeline before the optimizer's step at half the rate (gradients,
    the tied one's too, accumulate over steps)."""
    got = _run_ranks("tied_worker.py", 2, tmp_path, timeout=200)
    want_losses, want = reference_training(
        tied_worker.MODEL, {}, steps=tied_worker.STEPS, batch_size=tied_worker.BATCH, lr=tied_worker.LR
    )
    loaded = rebuild_model(tied_worker.plan_for("zb-v"))
    start = dict(loaded.model.named_parameters())  # shared.weight once
    traced = trace_for_plan(tied_worker.plan_for("zb-v"), loaded.model, loaded.make_inputs(2))
    # the encoder embedding (stage 0), the decoder embedding (2) and the head (3) use the tie
    assert split_model(traced, tied_worker.plan_for("zb-v")).shared_params == (("shared.weight", (0, 2, 3)),)
    placed = {"interleaved-1f1b": [0, 1, 0, 1], "zb-v": [0, 1, 1, 0], "dualpipe-v": [0, 1, 1, 0]}
    for schedule in tied_worker.SCHEDULES:
        assert got[0][f"{schedule}/placement"] == placed[schedule], schedule
        assert len({placed[schedule][j] for j in (0, 2, 3)}) == 2, schedule  # two of its users share a rank
        for way in tied_worker.WAYS:
            key = f"{schedule}/{way}"
            assert "error" not in got[0][key], (key, got[0][key])
            losses = got[0][key]["losses"] or got[1][key]["losses"]  # type: ignore[index]  # export: the last rank's
            if way != "export":  # pipeline.step returns the batch loss on every rank
                assert got[0][key]["losses"] == got[1][key]["losses"], key  # type: ignore[index]
            assert len(losses) == tied_worker.STEPS, (key, losses)
            for a, b in zip(losses, want_losses, strict=True):
                assert abs(a - b) <= 1e-6 * abs(b), (key, losses, want_losses)
            trained = set(start) - {"pooler.weight", "pooler.bias"}  # no forward uses the pooler
            assert set(got[0][key]["params"]) | set(got[1][key]["params"]) == trained, key  # type: ignore[index]
            if way != "export":  # the ranks' state_dicts: exactly the model's, the pooler kept by one rank
                states = [got[r][key]["state"] for r in range(2)]  # type: ignore[index]
                assert set(states[0]) | set(states[1]) == set(loaded.model.state_dict()), key
                assert sum("pooler.weight" in st for st in states) == 1, key
                for st in states:
                    for name, value in st.items():
                        assert float((value - want[name]).abs().max()) <= 1e-6 * float(want[name].abs().max()), name
            for r in range(2):  # each rank's copy of the tied weight, too
                for name, value in got[r][key]["params"].items():  # type: ignore[index]
                    scale = float(want[name].abs().max())
                    assert float((value - want[name]).abs().max()) <= 1e-6 * scale, (key, r, name)
    moved = float((want["shared.weight"] - start["shared.weight"].detach()).abs().max())
    assert moved > 1e-2  # training changed the tied weight, so the comparison means something
