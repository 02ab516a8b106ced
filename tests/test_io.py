"""Output paths are checked before any work, in one line, for every command; writes are atomic."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from autopipe.cli.main import main

from autopipe._io import atomic_write, atomic_write_text, check_output_file, check_output_folder
from autopipe.errors import OutputError
from tests.helpers import MODELS, even_plan

ODD = os.fsdecode(b"odd\xff\xfename.json")


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("io") / "plan.json"
    even_plan("mlp.py").save(path)
    return path


def test_check_output_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    cases = {
        "/proc/x.json": "--output /proc/x.json: cannot write in /proc (",
        f"{tmp_path}/file/x.json": (
            f"--output {tmp_path}/file/x.json: {tmp_path}/file is a file, not a folder; write elsewhere"
        ),
        f"{tmp_path}/none/x.json": (
            f"--output {tmp_path}/none/x.json: folder {tmp_path}/none does not exist; create it or write elsewhere"
        ),
        str(tmp_path): f"--output {tmp_path} is a directory; name a file, e.g. {tmp_path}/out.json",
        f"{tmp_path}/{ODD}": (
            f"--output {tmp_path}/odd\\xff\\xfename.json has bytes that are not UTF-8; choose a UTF-8 name"
        ),
        f"{tmp_path}/a\x00b": f"--output '{tmp_path}/a\\x00b' contains a NUL byte; choose another name",
        "": "--output is empty; name a file to write",
    }
    for path, message in cases.items():
        with pytest.raises(OutputError) as info:
            check_output_file(path, "--output")
        assert str(info.value).startswith(message), (path, str(info.value))
    assert check_output_file(tmp_path / "new.json", "--output") == tmp_path / "new.json"
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # the probe left nothing behind


def test_check_output_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert check_output_folder(tmp_path / "a" / "b", "-o") == tmp_path / "a" / "b"  # made when writing
    with pytest.raises(OutputError, match=r"^-o .*/file/stages: .*/file is a file, not a folder; write elsewhere$"):
        check_output_folder(tmp_path / "file" / "stages", "-o")
    with pytest.raises(OutputError, match=r"^-o .*/file is a file, not a folder; name a new folder$"):
        check_output_folder(tmp_path / "file", "-o")
    with pytest.raises(OutputError, match=r"^-o /proc/stages: cannot write in /proc \(.*\); write elsewhere$"):
        check_output_folder("/proc/stages", "-o")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 555 folder")
def test_read_only_folder(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(OutputError, match=r"cannot write in .*/ro \(Permission denied\); write elsewhere$"):
            check_output_file(ro / "plan.json", "--output")
    finally:
        ro.chmod(0o755)


def test_writes_are_atomic(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    atomic_write_text(target, "old")

    def broken(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("crash while writing")

    with pytest.raises(RuntimeError):
        atomic_write(target, broken)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["plan.json"]
    atomic_write(target, lambda tmp: tmp.write_text("new"))
    assert target.read_text() == "new"


def _args(plan_file: Path, tmp_path: Path) -> dict[str, list[str]]:
    profile = str(tmp_path / "profile.json")  # never read: the output path is refused first
    model = str(MODELS / "mlp.py")
    return {
        "plan -o": ["plan", "--profile", profile, "-o", "{out}"],
        "plan --timeline": ["plan", "--profile", profile, "-o", str(tmp_path / "p.json"), "--timeline", "{out}.png"],
        "show --timeline": ["show", str(plan_file), "--timeline", "{out}.png"],
        "profile -o": ["profile", model, "-o", "{out}"],
        "emit -o": ["emit", str(plan_file), "-o", "{out}"],
        "merge -o": ["merge", str(tmp_path / "no-stages"), "-o", "{out}"],
        "run --trace": ["run", str(plan_file), "--trace", "{out}"],
    }


@pytest.mark.parametrize(
    "command", ["plan -o", "plan --timeline", "show --timeline", "profile -o", "emit -o", "merge -o", "run --trace"]
)
def test_every_output_flag_is_checked_first(
    command: str, plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    flag = {"emit -o": "--output", "merge -o": "--output", "plan -o": "--output", "profile -o": "--output"}.get(
        command, command.split()[1]
    )
    for out, why in [
        ("/proc/x", "cannot write in /proc"),
        (f"{tmp_path}/file/x", f"{tmp_path}/file is a file, not a folder"),
        (f"{tmp_path}/{ODD}", "has bytes that are not UTF-8"),
    ]:
        argv = [a.replace("{out}", out) for a in _args(plan_file, tmp_path)[command]]
        assert main(argv) == 2, (command, out)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"autopipe: error: {flag} ") and why in err, (command, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written, nothing half-written
