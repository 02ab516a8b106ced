"""Checkpoints with a commit point: a save replaces the folder whole or not at all, a resume
takes only a folder its manifest lists exactly, and the run's optimizer flags apply."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import main

from autopipe.errors import RunOptionError, RuntimeFailure
from autopipe.runtime import RunOptions, assemble_state_dict, commit, run_threads
from autopipe.runtime.checkpoint import file_entry, read_meta, verify_folder
from autopipe.runtime.commit import clean_leftovers, leftovers, new_token, publish, recover, sibling
from autopipe.runtime.run.launch import launch
from autopipe.runtime.run.options import check_options
from tests.runtime.helpers import cached_plan, fake_checkpoint, rebuilt_for

torch.set_num_threads(1)
_AGAIN = "save the checkpoint again with --save-checkpoint"
_CHANGED = "(changed since the save, or of another save)"


def _options(**kw: object) -> RunOptions:
    return RunOptions(**{"steps": 1, "lr": 0.1, "timeout_s": 30, **kw})  # type: ignore[arg-type]


def _save(folder: Path, **kw: object) -> None:
    plan = cached_plan("skip", 2, "1f1b")
    run_threads(plan, _options(save_checkpoint=str(folder), **kw), rebuilt_for(plan))


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two real checkpoints of one plan: after one step, and after two."""
    root = tmp_path_factory.mktemp("ck")
    _save(root / "one")
    _save(root / "two", steps=2)
    return root / "one", root / "two"


def _siblings(folder: Path) -> list[str]:
    """What a save could leave beside ``folder``: anything but the folder itself."""
    return sorted(n for n in os.listdir(folder.parent) if n != folder.name and n.startswith(f".{folder.name}"))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ------------------------------------------------------------------------------ saving


@pytest.mark.slow
def test_a_save_replaces_the_folder_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    _save(ck)
    _save(ck, resume=str(ck))
    meta = verify_folder(ck)  # every file listed, of its size and SHA-256, nothing else
    assert meta["step"] == 2 and sorted(os.listdir(ck)) == [
        "meta.json",
        "rank-0.pt",
        "rank-1.pt",
        "stage-0.pt",
        "stage-1.pt",
    ]
    assert meta["optimizer"] == {"name": "Adam", "lr": 0.1, "args": {}}
    assert _siblings(ck) == []
    link = tmp_path / "link"
    link.symlink_to(ck)
    _save(link, resume=str(link))  # through a link: the link stays, pointing at the new folder
    assert link.is_symlink() and read_meta(ck)["step"] == 3 and _siblings(ck) == []


@pytest.mark.slow
def test_a_failed_write_leaves_the_previous_checkpoint_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = tmp_path / "ck"
    _save(ck)
    before = {n: (ck / n).read_bytes() for n in os.listdir(ck)}
    real = commit.torch_save

    def full_disk(obj: object, path: str | Path) -> None:
        if Path(path).name == "rank-1.pt":
            Path(path).write_bytes(b"half")  # what a write cut short leaves
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(obj, path)

    monkeypatch.setattr(commit, "torch_save", full_disk)
    with pytest.raises((OSError, RuntimeFailure)):
        _save(ck, resume=str(ck))
    assert {n: (ck / n).read_bytes() for n in os.listdir(ck)} == before
    assert _siblings(ck) == [] and list(tmp_path.iterdir()) == [ck]


@pytest.mark.slow
def test_where_folders_cannot_swap_two_renames_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit, "_exchange", lambda a, b: False)
    ck = tmp_path / "ck"
    _save(ck)
    _save(ck, resume=str(ck))
    assert verify_folder(ck)["step"] == 2 and _siblings(ck) == []


@pytest.mark.parametrize("complete", [True, False])
def test_a_commit_cut_between_its_renames_is_finished(complete: bool, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    token = f"{new_token().split('-')[0]}-{_dead_pid()}-abcdef"
    fake_checkpoint(sibling(ck, token, "old"), step=1)
    new = fake_checkpoint(sibling(ck, token, "new"), step=2)
    if not complete:
        (new / "meta.json").unlink()  # killed before its manifest: not the new checkpoint
    recover(ck)
    assert verify_folder(ck)["step"] == (2 if complete else 1)
    clean_leftovers(ck)
    assert _siblings(ck) == []


def test_only_the_leftovers_of_dead_processes_are_removed(tmp_path: Path) -> None:
    ck = fake_checkpoint(tmp_path / "ck")
    host = new_token().split("-")[0]
    other = "000000" if host != "000000" else "111111"
    dead = sibling(ck, f"{host}-{_dead_pid()}-abcdef")
    live = [sibling(ck, f"{host}-{os.getpid()}-abcdef"), sibling(ck, f"{other}-1-abcdef", "old")]
    unrelated = tmp_path / ".ck.new-notes"
    for p in [dead, *live, unrelated]:
        p.mkdir()
    assert set(leftovers(ck)) == {dead, *live}
    assert clean_leftovers(ck) == [dead]
    assert sorted(tmp_path.iterdir()) == sorted([ck, *live, unrelated])


def test_a_save_never_replaces_a_folder_of_other_files(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(RunOptionError) as info:
        check_options(RunOptions(save_checkpoint=str(folder)))
    assert str(info.value) == (
        f"--save-checkpoint {str(folder)!r} holds 'notes.txt', which is no checkpoint's file: a save replaces "
        "the folder whole; give a new or empty folder, or a checkpoint folder"
    )
    new = fake_checkpoint(tmp_path / ".work.new-x")
    with pytest.raises(RuntimeFailure, match=r"now holds 'notes.txt', which is no checkpoint's"):
        publish(new, folder, "x")  # added between the check and the commit
    assert os.listdir(folder) == ["notes.txt"]
    name = "c" * (commit.MAX_NAME_BYTES + 1)
    limit = commit.MAX_NAME_BYTES
    with pytest.raises(RunOptionError, match=rf"^--save-checkpoint 'c+\.\.\.': the name is longer than {limit} bytes"):
        check_options(RunOptions(save_checkpoint=name))
    check_options(RunOptions(save_checkpoint=str(fake_checkpoint(tmp_path / "ck"))))  # a checkpoint: replaced


# ------------------------------------------------------------------------------ resuming


def _copy_of(saved: Path, tmp: Path) -> Path:
    return Path(shutil.copytree(saved, tmp / "ck"))


def _replace_stage(ck: Path, other: Path) -> str:
    shutil.copy(other / "stage-1.pt", ck / "stage-1.pt")  # the same size: another save's
    return f"{ck / 'stage-1.pt'} does not match its SHA-256 in meta.json " + _CHANGED


def _truncate(ck: Path, other: Path) -> str:
    size = (ck / "stage-0.pt").stat().st_size
    os.truncate(ck / "stage-0.pt", size // 2)
    return f"{ck / 'stage-0.pt'} is {size // 2} bytes, its meta.json says {size} " + _CHANGED


def _remove_rank(ck: Path, other: Path) -> str:
    (ck / "rank-1.pt").unlink()
    return f"checkpoint {ck} has no rank-1.pt, which its meta.json lists (a partial save)"


def _extra_stage(ck: Path, other: Path) -> str:
    shutil.copy(ck / "stage-1.pt", ck / "stage-2.pt")
    return (
        f"{ck / 'stage-2.pt'} is not in the checkpoint's meta.json (a file of another save, or added since): "
        "the folder is not one checkpoint"
    )


def _link_stage(ck: Path, other: Path) -> str:
    outside = ck.parent / "outside.pt"
    shutil.move(ck / "stage-0.pt", outside)  # the very bytes, out of the folder
    (ck / "stage-0.pt").symlink_to(outside)
    return f"{ck / 'stage-0.pt'} is a symbolic link, not a checkpoint file (not followed)"


def _link_meta(ck: Path, other: Path) -> str:
    shutil.move(ck / "meta.json", ck.parent / "meta.json")
    (ck / "meta.json").symlink_to(ck.parent / "meta.json")
    return f"{ck / 'meta.json'} is a symbolic link, not a checkpoint file (not followed)"


def _fifo(ck: Path, other: Path) -> str:
    (ck / "stage-1.pt").unlink()
    os.mkfifo(ck / "stage-1.pt")
    return f"{ck / 'stage-1.pt'} is a special file, not a checkpoint file (not followed)"


def _path_in_manifest(ck: Path, other: Path) -> str:
    meta = json.loads((ck / "meta.json").read_text())
    meta["files"]["../stage-0.pt"] = meta["files"].pop("stage-0.pt")
    (ck / "meta.json").write_text(json.dumps(meta))
    return (
        f"{ck / 'meta.json'} is not a valid checkpoint file (it lists '../stage-0.pt', which is no checkpoint "
        "file's name)"
    )


def _old_format(ck: Path, other: Path) -> str:
    meta = json.loads((ck / "meta.json").read_text())
    (ck / "meta.json").write_text(json.dumps({k: meta[k] for k in ("fingerprint", "step", "stages")}))
    return (
        f"{ck / 'meta.json'} is not a valid checkpoint file (it lists no files: not written by this autopipe's "
        "--save-checkpoint (format 2))"
    )


TAMPER: dict[str, Callable[[Path, Path], str]] = {
    "replaced": _replace_stage,
    "truncated": _truncate,
    "missing": _remove_rank,
    "extra": _extra_stage,
    "symlink": _link_stage,
    "meta-symlink": _link_meta,
    "fifo": _fifo,
    "path-in-manifest": _path_in_manifest,
    "old-format": _old_format,
}


def _no_rank(*args: object, **kwargs: object) -> None:
    raise AssertionError("a rank was started")


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(TAMPER))
def test_a_tampered_checkpoint_is_refused_in_one_line_before_any_rank_starts(
    damage: str,
    saved: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ck = _copy_of(saved[0], tmp_path)
    problem = TAMPER[damage](ck, saved[1])
    message = f"--resume: {problem}; {_AGAIN}"
    plan = cached_plan("skip", 2, "1f1b")
    plan.save(tmp_path / "plan.json")
    monkeypatch.setattr(subprocess, "Popen", _no_rank)
    argv = ["run", str(tmp_path / "plan.json"), "--steps", "1", "--device", "cpu", "--resume", str(ck)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"autopipe: error: {message}\n"
    with pytest.raises(RunOptionError) as info:  # the API: the same line, the typed error
        launch(plan, _options(resume=str(ck)))
    assert str(info.value) == message
    monkeypatch.undo()
    with pytest.raises(RuntimeFailure) as failed:  # the ranks' own check (torchrun, run_threads)
        run_threads(plan, _options(resume=str(ck)), rebuilt_for(plan))
    assert str(failed.value) == f"{problem}; {_AGAIN}"
    assert not list(tmp_path.glob("**/*.tmp"))


@pytest.mark.slow
def test_resume_applies_the_runs_optimizer_flags(
    saved: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = saved[0]
    weights = assemble_state_dict(one)
    capsys.readouterr()
    _save(tmp_path / "lr0", resume=str(one), lr=0.0)
    assert capsys.readouterr().err == (
        "autopipe: resuming with this run's optimizer flags: --lr 0 (the checkpoint's run: 0.1)\n"
    )
    _save(tmp_path / "lr05", resume=str(one), lr=0.5)
    after0, after05 = assemble_state_dict(tmp_path / "lr0"), assemble_state_dict(tmp_path / "lr05")
    assert all(torch.equal(weights[k], after0[k]) for k in weights)  # --lr 0: not one weight moved
    assert any(not torch.equal(weights[k], after05[k]) for k in weights)
    assert read_meta(tmp_path / "lr0")["step"] == 2 and read_meta(tmp_path / "lr0")["optimizer"]["lr"] == 0.0
    saved_state = torch.load(tmp_path / "lr05" / "rank-0.pt", weights_only=True)["optimizer"]
    assert {g["lr"] for g in saved_state["param_groups"]} == {0.5}
    capsys.readouterr()
    _save(tmp_path / "same", resume=str(one))
    assert capsys.readouterr().err == ""  # the same flags: nothing to say


def test_resume_refuses_another_optimizer_or_state_it_lacks(tmp_path: Path) -> None:
    ck = fake_checkpoint(tmp_path / "ck", optimizer="Adam")
    with pytest.raises(RunOptionError) as info:
        check_options(RunOptions(resume=str(ck), optimizer="SGD"))
    assert str(info.value) == (
        f"--resume {str(ck)!r}: the checkpoint holds 'Adam' optimizer state, this run makes SGD; "
        "resume with --optimizer Adam, or start again without --resume"
    )
    with pytest.raises(RunOptionError) as info:
        check_options(RunOptions(resume=str(ck), optimizer_kwargs=(("amsgrad", 1.0),)))
    assert str(info.value) == (
        f"--optimizer-arg amsgrad=1 with --resume {str(ck)!r}: the checkpoint's Adam state was saved without "
        "amsgrad and has no running maxima; resume without amsgrad"
    )
    check_options(RunOptions(resume=str(ck), lr=0.5, optimizer_kwargs=(("weight_decay", 0.1),)))  # applied


def test_a_manifest_entry_is_the_files_size_and_hash(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    assert file_entry(tmp_path / "f") == {
        "bytes": 3,
        "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    }


@pytest.mark.slow
def test_autopipe_run_resumes_with_its_lr(
    saved: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cached_plan("skip", 2, "1f1b").save(tmp_path / "plan.json")
    weights = assemble_state_dict(saved[0])
    argv = ["run", str(tmp_path / "plan.json"), "--steps", "1", "--device", "cpu", "--timeout", "30"]
    for lr in ("0", "0.5"):
        out = str(tmp_path / f"lr{lr}")
        assert main([*argv, "--resume", str(saved[0]), "--lr", lr, "--save-checkpoint", out]) == 0
        note = f"autopipe: resuming with this run's optimizer flags: --lr {lr} (the checkpoint's run: 0.1)\n"
        assert note in capsys.readouterr().err
    after0, after05 = assemble_state_dict(tmp_path / "lr0"), assemble_state_dict(tmp_path / "lr0.5")
    assert all(torch.equal(weights[k], after0[k]) for k in weights)
    assert any(not torch.equal(weights[k], after05[k]) for k in weights)
