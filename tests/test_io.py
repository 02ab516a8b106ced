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
    # docs/security.md: "Every output (`-o`, `--timeline`, `--trace`, `--schedule-csv`, `profile -o`"
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
    # docs/security.md: "Every output (`-o`, `--timeline`, `--trace`"
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


def test_special_files_are_written_in_place_and_links_through(tmp_path: Path) -> None:
    # docs/security.md: "Writing replaces only a regular file."
    # docs/security.md: "A FIFO, a character device (`/dev/null`) or `/dev/stdout` gets the bytes in place"
    """A FIFO's reader gets the bytes, /dev/null stays a device, a link stays a link to a new target."""
    import stat
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert check_output_file(fifo, "-o") == fifo
    atomic_write_text(fifo, "through the pipe")
    reader.join(timeout=10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)

    atomic_write_text("/dev/null", "gone")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(OutputError, match=r"^cannot write /dev/full: No space left on device$"):
        atomic_write_text("/dev/full", "x" * 10_000)  # a full disk: one line

    target, link = tmp_path / "plan.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target.name)
    atomic_write_text(check_output_file(link, "-o"), "new")
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to("made.json")
    atomic_write_text(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "made.json").read_text() == "made"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dangling.json",
        "fifo",
        "link.json",
        "made.json",
        "plan.json",
    ]


def test_dev_stdout_gets_the_bytes_where_the_shell_sent_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "out.txt"
    code = "from autopipe._io import atomic_write_text as w; w('/dev/stdout', 'to the redirect\\n')"
    with open(out, "w") as f:
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True, timeout=60)
    assert out.read_text() == "to the redirect\n"


def test_outputs_that_cannot_be_files_are_refused_first(tmp_path: Path) -> None:
    # docs/security.md: "A FIFO, a character device (`/dev/null`) or `/dev/stdout` gets the bytes in place"
    import socket

    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(sock_path))
        with pytest.raises(OutputError, match=r"^-o .*/s\.sock is a socket, not a file; name a regular file to write$"):
            check_output_file(sock_path, "-o")
    finally:
        sock.close()
    (tmp_path / "d").mkdir()
    (tmp_path / "to-dir").symlink_to("d")
    with pytest.raises(OutputError, match=r"^-o .*/to-dir is a directory; name a file"):
        check_output_file(tmp_path / "to-dir", "-o")
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    fits = tmp_path / ("p" * (limit - 5) + ".json")
    assert check_output_file(fits, "-o") == fits
    for name in ("p" * (limit - 4) + ".json", "p." + "x" * (limit - 3)):  # too long; its temporary name too long
        with pytest.raises(
            OutputError,
            match=rf"the name is too long \(\d+ bytes with the temporary name; this file "
            rf"system takes {limit}\); choose a shorter name$",
        ):
            check_output_file(tmp_path / name, "-o")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "s.sock", "to-dir"]


def test_a_folder_given_for_a_file_suggests_a_file_of_that_kind(
    plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, example in [
        (["emit", str(plan_file), "--schedule-csv", str(tmp_path)], "1f1b.csv"),
        (["show", str(plan_file), "--timeline", str(tmp_path)], "timeline.png"),
        (["config", str(plan_file), "--for", "torchtitan-0.2", "-o", str(tmp_path)], "titan.toml"),
        (["merge", str(tmp_path), "-o", str(tmp_path)], "model.pt"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.endswith(f" is a directory; name a file, e.g. {tmp_path / example}\n"), (argv, err)
