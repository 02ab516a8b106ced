"""Checkpoints: a resumed run continues bit for bit; files are loaded as data, never as code."""

from __future__ import annotations

import json
import pathlib
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

from autopipe import pipeline
from autopipe.errors import RuntimeFailure
from autopipe.model.load import LoadedModel, load_model
from autopipe.runtime import RunOptions, assemble_state_dict, run_threads
from autopipe.runtime.checkpoint import file_entry, load_file, load_rank, read_meta
from autopipe.runtime.comm import ThreadHub
from autopipe.runtime.commit import write_meta, write_rank_files
from autopipe.stages.state import slot_tensor, state_slots
from tests.helpers import FIXTURES, ROOT, even_plan
from tests.runtime.helpers import GPT, cached_plan, on_threads, rebuilt_for

torch.set_num_threads(1)


@pytest.mark.slow
def test_resume_continues_bit_for_bit(tmp_path: Path) -> None:
    plan = cached_plan("gpt", 2, "zb-h1")
    base = dict(optimizer="Adam", lr=1e-2, timeout_s=30)
    run_threads(plan, RunOptions(steps=4, save_checkpoint=str(tmp_path / "full"), **base))  # type: ignore[arg-type]
    run_threads(plan, RunOptions(steps=2, save_checkpoint=str(tmp_path / "half"), **base))  # type: ignore[arg-type]
    resumed = RunOptions(steps=2, resume=str(tmp_path / "half"), save_checkpoint=str(tmp_path / "end"), **base)  # type: ignore[arg-type]
    results = run_threads(plan, resumed)
    assert results[0].steps_done == 4
    full, end = assemble_state_dict(tmp_path / "full"), assemble_state_dict(tmp_path / "end")
    assert set(full) == set(end)
    assert all(torch.equal(full[k], end[k]) for k in full)


class _Payload:
    """Unpickling this creates ``marker``: a checkpoint that would run code if loaded as pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (pathlib.Path.touch, (self.marker,))


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("Adam", lambda ps: torch.optim.Adam(ps, lr=0.1)),
        ("AdamW", lambda ps: torch.optim.AdamW(ps, lr=0.1, amsgrad=True)),
        ("SGD", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)),
    ],
)
def test_optimizer_state_loads_as_data(
    name: str, make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = make(list(model.parameters()))
    for _ in range(2):
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
    torch.save({"optimizer": opt.state_dict()}, tmp_path / "rank-0.pt")
    back = make(list(torch.nn.Linear(4, 3).parameters()))
    back.load_state_dict(load_file(tmp_path / "rank-0.pt")["optimizer"])  # weights_only=True
    a, b = opt.state_dict(), back.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i, state in a["state"].items():
        assert state.keys() == b["state"][i].keys()
        assert all(torch.equal(torch.as_tensor(v), torch.as_tensor(b["state"][i][k])) for k, v in state.items())


@pytest.fixture(scope="module")
def _checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint (one step of a 2-rank plan), saved once for this module's tests."""
    folder = tmp_path_factory.mktemp("saved") / "ck"
    plan = cached_plan("skip", 2, "1f1b")
    run_threads(plan, RunOptions(steps=1, lr=0.1, timeout_s=30, save_checkpoint=str(folder)), rebuilt_for(plan))
    assert json.loads((folder / "meta.json").read_text())["step"] == 1
    return folder


def _resume(checkpoint: Path, tmp_path: Path) -> Callable[[], object]:
    """Copy the checkpoint into ``tmp_path / "ck"``; a function resuming the run from there."""
    shutil.copytree(checkpoint, tmp_path / "ck")
    plan = cached_plan("skip", 2, "1f1b")
    options = RunOptions(steps=1, lr=0.1, timeout_s=30, resume=str(tmp_path / "ck"))
    return lambda: run_threads(plan, options, rebuilt_for(plan))


def _rehash(folder: Path) -> None:
    """The manifest made to match the folder's files again (as a crafted checkpoint's would)."""
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"] = {name: file_entry(folder / name) for name in meta["files"]}
    (folder / "meta.json").write_text(json.dumps(meta))


def test_a_crafted_checkpoint_runs_no_code(_checkpoint: Path, tmp_path: Path) -> None:
    # docs/security.md: "Checkpoints and emitted weights are read with `torch.load(weights_only=True)`"
    resume = _resume(_checkpoint, tmp_path)
    marker = tmp_path / "marker"
    torch.save({"optimizer": _Payload(marker)}, tmp_path / "ck" / "rank-0.pt")
    _rehash(tmp_path / "ck")  # a crafter writes the manifest too: what loads as data is the last guard
    path = tmp_path / "ck" / "rank-0.pt"
    with pytest.raises(RuntimeFailure) as info:
        resume()
    assert str(info.value) == (
        f"{path} is not a valid checkpoint file (it holds Python objects, not only tensors and numbers; "
        "not loaded, as that could run code); save the checkpoint again with --save-checkpoint"
    )
    assert not marker.exists()
    # as plain pickle it would have run: the test's payload is real
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_stage_file_is_one_line(damage: str, _checkpoint: Path, tmp_path: Path) -> None:
    resume = _resume(_checkpoint, tmp_path)
    path = tmp_path / "ck" / "stage-1.pt"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"not a checkpoint " * 9, "empty": b""}[damage])
    _rehash(tmp_path / "ck")
    with pytest.raises(RuntimeFailure) as info:
        resume()
    message = str(info.value)
    assert message.startswith(f"{path} is not a valid checkpoint file (truncated or not written by torch.save: ")
    assert message.endswith("); save the checkpoint again with --save-checkpoint") and "\n" not in message
    with pytest.raises(RuntimeFailure, match=r"stage-1\.pt is not a valid checkpoint file"):
        assemble_state_dict(tmp_path / "ck")


def test_a_damaged_meta_json_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text('{"fingerprint": "abc", "step": "4", "stages": 2}')
    with pytest.raises(
        RuntimeFailure, match=r"meta.json is not a valid checkpoint file \(it needs fingerprint: a string, step"
    ):
        read_meta(tmp_path)
    (tmp_path / "meta.json").write_bytes(b"\xff\xfe")
    with pytest.raises(RuntimeFailure, match=r"meta.json is not a valid checkpoint file \(not UTF-8 text\); save the"):
        read_meta(tmp_path)


@pytest.mark.slow
def test_autopipe_run_resume_from_a_crafted_checkpoint_is_one_line(
    _checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(_checkpoint, tmp_path / "ck")
    marker = tmp_path / "marker"
    torch.save({"optimizer": _Payload(marker)}, tmp_path / "ck" / "rank-1.pt")
    _rehash(tmp_path / "ck")
    cached_plan("skip", 2, "1f1b").save(tmp_path / "plan.json")
    argv = ["run", str(tmp_path / "plan.json"), "--steps", "1", "--device", "cpu", "--timeout", "30", "--lr", "0.1"]
    assert main([*argv, "--resume", str(tmp_path / "ck")]) == 1
    assert capsys.readouterr().err == (
        f"autopipe: error: rank 1 failed: RuntimeFailure: {tmp_path / 'ck' / 'rank-1.pt'} is not a valid checkpoint "
        "file (it holds Python objects, not only tensors and numbers; not loaded, as that could run code); "
        "save the checkpoint again with --save-checkpoint\n"
    )
    assert not marker.exists()


# --------------------------------------------------------------------------- the model's state_dict

BUNDLED = sorted(p.name for p in (ROOT / "models").glob("*.py"))
SMALL: dict[str, dict[str, object]] = {  # the bundled models, smaller than their defaults
    "hf_gpt2.py": {"n_layer": 2, "n_embd": 32, "seq_len": 16},
    "llama.py": {"n_layer": 2, "n_embd": 32, "vocab_size": 64, "block_size": 16},
    "resnet.py": {"layers": "1,1", "width": 8, "image_size": 16},
    "chargpt.py": {"n_layer": 2, "n_embd": 32, "seq_len": 16},
}
HF_STATE = str(FIXTURES / "hf_state.py")


def _check_state_is_the_models(file: str, kwargs: dict[str, object], tmp: Path) -> list[dict[str, torch.Tensor]]:
    """Two thread ranks of ``file``'s model, one training step: the union of their ``state_dict()``
    and of their checkpoint stage files is exactly the model's ``state_dict()``, strict-loadable,
    of the ranks' live trained tensors; every rank loads the whole model's state; resume restores."""
    plan = even_plan(file, kwargs, stages=2, micro_batches=2, micro_batch_size=2, reuse_trace=True)

    def build(seed: int) -> LoadedModel:
        torch.manual_seed(seed)
        return load_model(file, kwargs)

    hub = ThreadHub(2, 30.0)
    built = [build(0) for _ in range(2)]
    pipes = [  # built one after the other: tracing is not thread-safe
        pipeline(
            plan,
            lm.model,
            rank=r,
            comm=lambda groups, r=r: hub.comm(r),  # type: ignore[misc]
            device="cpu",
            example_inputs=lm.make_inputs(2),
            loss_fn=lm.loss_fn,
        )
        for r, lm in enumerate(built)
    ]
    opts = [torch.optim.SGD(p.parameters(), lr=0.1) for p in pipes]
    lm, before = built[0], build(0).model.state_dict()
    batch = (lm.make_inputs(4), lm.make_targets(4) if lm.make_targets else None)

    def step(rank: int) -> None:
        pipes[rank].step(*batch)
        opts[rank].step()

    on_threads(hub, step)
    states = [p.state_dict() for p in pipes]
    union = {k: v.clone() for s in states for k, v in s.items()}
    fresh = build(1).model
    assert list(union) != [] and set(union) == set(fresh.state_dict())
    fresh.load_state_dict(union, strict=True)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in union.items())
    assert any(not torch.equal(before[k], v) for k, v in union.items())  # trained values

    folder = tmp / "ck"
    folder.mkdir()
    files: dict[str, dict[str, object]] = {}
    for rank, (p, opt) in enumerate(zip(pipes, opts, strict=True)):
        files.update(write_rank_files(folder, rank, p.stage_state_dicts(), opt))
    optimizer = {"name": "SGD", "lr": 0.1, "args": {}}
    fingerprint = plan.recipe.fingerprint
    write_meta(folder, fingerprint=fingerprint, step=1, stages=len(plan.stages), files=files, optimizer=optimizer)
    assembled = assemble_state_dict(folder)
    assert set(assembled) == set(union) and all(torch.equal(assembled[k], v) for k, v in union.items())
    build(2).model.load_state_dict(assembled, strict=True)

    other = build(3).model.state_dict()
    for p in pipes:  # the whole model's state on every rank: each takes its part
        p.load_state_dict(other)
    assert all(torch.equal(v, other[k]) for s in states for k, v in s.items())  # live tensors, loaded in place
    for rank, (p, opt) in enumerate(zip(pipes, opts, strict=True)):
        assert load_rank(folder, rank, p, opt, plan.recipe.fingerprint) == 1
    assert all(torch.equal(v, union[k]) for p in pipes for k, v in p.state_dict().items())
    return states


def test_each_entry_of_the_models_state_has_one_place() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    )
    model.register_buffer("scale", torch.ones(1), persistent=False)
    model.register_buffer("steps", torch.zeros(1))
    first, second = torch.nn.Module(), torch.nn.Module()
    first.register_module("0", model[0])
    first.register_buffer("scale", model.scale)  # held, but not the model's state
    first.register_buffer("lifted_tensor_0", torch.ones(1))  # a tracer's constant
    second.register_module("1", torch.nn.Module())
    second.get_submodule("1").register_module("0", model[1][0])  # model[1][1], the LayerNorm, no stage uses
    slots = state_slots(model, [(0, first), (1, second)])
    assert [(s.stage, s.keys) for s in slots] == [
        (0, ("steps",)),  # the whole model's: its nearest entry, 0.weight, is stage 0's
        (0, ("0.weight",)),
        (0, ("0.bias",)),
        (1, ("1.0.weight",)),
        (1, ("1.0.bias",)),
        (1, ("1.1.weight",)),  # its parent's nearest entry, 1.0.bias, is stage 1's
        (1, ("1.1.bias",)),
    ]
    assert slot_tensor(slots[5]) is model[1][1].weight and slot_tensor(slots[1]) is model[0].weight


@pytest.mark.slow
@pytest.mark.parametrize("model", BUNDLED)
def test_every_bundled_models_state_is_its_state(model: str, tmp_path: Path) -> None:
    # llama: rotary cos/sin, non-persistent buffers that fx's GraphModule holds as persistent ones;
    # resnet: BatchNorm statistics, trained in the step; gpt, chargpt, hf_gpt2: a tied head
    if model.startswith("hf"):
        pytest.importorskip("transformers")
    _check_state_is_the_models(str(ROOT / "models" / model), SMALL.get(model, {}), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("file", "arch"),
    [(HF_STATE, a) for a in ("gemma2", "falcon", "deberta", "swin", "clip", "gptj")]
    + [(str(FIXTURES / "hf_zoo.py"), a) for a in ("llama", "bert")],
    ids=lambda v: Path(v).stem if "/" in str(v) else str(v),
)
def test_a_hugging_face_models_state_is_its_state(file: str, arch: str, tmp_path: Path) -> None:
    # non-persistent buffers (inv_freq, embed_scale, position_ids, relative_position_index,
    # embed_positions), export-lifted constants (falcon, deberta), a tied head (gemma2, falcon),
    # a module no stage uses (clip's post_layernorm, kept by the rank of the last vision layer)
    pytest.importorskip("transformers")
    states = _check_state_is_the_models(file, {"arch": arch}, tmp_path)
    if arch == "clip":
        assert (
            "vision_model.post_layernorm.weight" in states[1] and "vision_model.post_layernorm.weight" not in states[0]
        )


def test_a_state_of_another_model_is_one_line() -> None:
    plan = cached_plan("gpt", 2, "1f1b")
    torch.manual_seed(0)
    lm = load_model(*GPT)
    pipe = pipeline(plan, lm.model, rank=0, comm=lambda g: ThreadHub(2, 1.0).comm(0), example_inputs=lm.make_inputs(2))
    state = lm.model.state_dict()
    with pytest.raises(
        RuntimeFailure, match=r"^the state has blocks\.0\.attn\.lifted_tensor_0 \(and 0 more\), which is not"
    ):
        pipe.load_state_dict({**state, "blocks.0.attn.lifted_tensor_0": torch.zeros(1)})
    name = next(iter(pipe.state_dict()))
    with pytest.raises(RuntimeFailure, match=rf"^the state's {re.escape(name)} is \(1,\), the model's is \("):
        pipe.load_state_dict({**state, name: torch.zeros(1)})
    first, last = next(iter(pipe.state_dict())), list(pipe.state_dict())[-1]
    before = pipe.state_dict()[first].clone()
    with pytest.raises(RuntimeFailure, match=rf"^the state's {re.escape(last)} is \(1,\)"):
        pipe.load_state_dict({**state, first: before + 1, last: torch.zeros(1)})
    assert torch.equal(pipe.state_dict()[first], before)  # checked before any entry is copied
