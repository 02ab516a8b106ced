"""One reader for every JSON file autopipe reads: each cause goes through every reader.

Plans, profiles, emit's ``manifest.json``, a checkpoint's ``meta.json``, device, calibration and
cluster files all go through ``autopipe._io.read_json``. Each cause of a crash the readers once
had (nesting 200,000 deep, a 5000-digit integer, bytes that are not UTF-8, a file over the size
limit, a FIFO that would block the read) is fed to every reader: through the Python API it is the
reader's own typed exception with one line naming the file and the problem; through every command
that reads that file it is exit 2 and that one line, within a timeout that only catches hangs.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
from autopipe.cli.main import main

from autopipe._io import MAX_JSON_BYTES, MAX_JSON_DEPTH, MAX_JSON_DIGITS, parse_json
from autopipe.costs.calibrate import stored_calibration
from autopipe.costs.devices import DeviceError, device_spec, read_cluster_file, read_device_file
from autopipe.costs.profile import Profile
from autopipe.errors import EmitError, PlanFileError, ProfileError, RuntimeFailure
from autopipe.plans import Plan
from autopipe.runtime.checkpoint import read_meta
from autopipe.stages.emit import emit
from autopipe.stages.merge import merge_state_dict, read_manifest
from tests.helpers import FIXTURES, ROOT, even_plan

LIMIT_S = 60  # a hang, not a slow case
MLP = str(FIXTURES / "good_mlp.py")
PROFILE = FIXTURES / "good_mlp_profile_v1.json"


@dataclass(frozen=True)
class Cause:
    name: str
    write: Callable[[Path], None]  # makes the bad file at the path
    says: str  # in the message, after "is not <what>" or in place of it


def _text(text: str) -> Callable[[Path], None]:
    return lambda p: p.write_text(text)


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _huge(p: Path) -> None:
    with open(p, "wb") as f:  # sparse: no disk used, but it is that big
        f.truncate(MAX_JSON_BYTES + 1)


CAUSES = (
    Cause("deep", _text("[" * 200_000 + "]" * 200_000), f"(nested more than {MAX_JSON_DEPTH} deep)"),
    Cause("deep objects", _text('{"a":' * 200_000 + "1" + "}" * 200_000), f"(nested more than {MAX_JSON_DEPTH} deep)"),
    Cause("deep, never closed", _text("[" * 200_000), f"(nested more than {MAX_JSON_DEPTH} deep)"),
    Cause("5000 digits", _text('{"version": ' + "9" * 5000 + "}"), f"(more than {MAX_JSON_DIGITS} digits in a row)"),
    Cause("not UTF-8", lambda p: p.write_bytes(b'{"version": "\xff\xfe"}'), "(not UTF-8 text)"),
    Cause("over the size limit", _huge, f"({MAX_JSON_BYTES + 1:,} bytes, over 128 MiB)"),
    Cause("a FIFO", _fifo, "is a FIFO, not"),
)


@dataclass(frozen=True)
class Reader:
    name: str
    file: str  # where the bad file goes, under the case's folder ("x.json", or "ck/meta.json")
    what: str  # "a plan": the words of its messages
    error: type[Exception]
    api: Callable[[Path], object]  # reads the file (given the path of the bad file)
    commands: tuple[Callable[[Path, Path], list[str]], ...]  # (bad file, scratch folder) -> argv


def _good_checkpoint(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)


READERS = (
    Reader(
        "plan",
        "plan.json",
        "a plan",
        PlanFileError,
        Plan.load,
        (
            lambda f, tmp: ["show", str(f)],
            lambda f, tmp: ["config", str(f), "--for", "megatron"],
            lambda f, tmp: ["emit", str(f), "--no-weights", "-o", str(tmp / "out")],
            lambda f, tmp: ["run", str(f), "--device", "cpu", "--timeout", "5"],
        ),
    ),
    Reader(
        "profile",
        "profile.json",
        "a profile",
        ProfileError,
        Profile.load,
        (
            lambda f, tmp: ["plan", "--profile", str(f), "--stages", "2", "-o", str(tmp / "p.json")],
            lambda f, tmp: ["calibrate", str(f), "--model", MLP, "-o", str(tmp / "cal.json")],
        ),
    ),
    Reader(
        "manifest",
        "stages/manifest.json",
        "a stage manifest",
        EmitError,
        lambda f: (read_manifest(f.parent), merge_state_dict(f.parent)),
        (lambda f, tmp: ["merge", str(f.parent), "-o", str(tmp / "merged.pt")],),
    ),
    Reader(
        "checkpoint meta",
        "ck/meta.json",
        "a valid checkpoint file",
        RuntimeFailure,
        lambda f: read_meta(f.parent),
        (lambda f, tmp: ["run", "plan.json", "--device", "cpu", "--resume", str(f.parent)],),
    ),
    Reader(
        "device file",
        "devices.json",
        "a device file",
        DeviceError,
        lambda f: (read_device_file(f), device_spec("h100", [f])),
        (
            lambda f, tmp: ["plan", MLP, "--device", "h100", "--device-file", str(f), "-o", str(tmp / "p.json")],
            lambda f, tmp: ["calibrate", str(PROFILE), "--model", MLP, "--device-file", str(f)],
        ),
    ),
    Reader(
        "calibration file",
        "cal.json",
        "a calibration file",
        DeviceError,
        lambda f: stored_calibration(device_spec("h100"), f),
        (lambda f, tmp: ["plan", MLP, "--device", "h100", "--calibration", str(f), "-o", str(tmp / "p.json")],),
    ),
    Reader(
        "cluster file",
        "cluster.json",
        "a cluster file",
        DeviceError,
        read_cluster_file,
        (
            lambda f, tmp: [
                *("plan", MLP, "--device", "h100", "--gpus", "8", "--cluster", str(f), "-o", str(tmp / "p.json"))
            ],
        ),
    ),
)


def _bad_file(tmp: Path, reader: Reader, cause: Cause) -> Path:
    path = tmp / reader.file
    path.parent.mkdir(parents=True, exist_ok=True)
    cause.write(path)
    return path


def _expected(path: Path, reader: Reader, cause: Cause) -> str:
    if cause.says.startswith("is a"):
        return f"{path} {cause.says} {reader.what};"
    return f"{path} is not {reader.what} {cause.says};"


class _TimedOut(Exception):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _TimedOut()


def _within_limit(fn: Callable[[], object]) -> object:
    """``fn()``, cut off after LIMIT_S (a FIFO that blocks the read would otherwise hang the test)."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
    try:
        return fn()
    except _TimedOut:
        pytest.fail(f"still reading after {LIMIT_S} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("cause", CAUSES, ids=[c.name for c in CAUSES])
@pytest.mark.parametrize("reader", READERS, ids=[r.name for r in READERS])
def test_every_reader_refuses_every_cause_in_one_typed_line(tmp_path: Path, reader: Reader, cause: Cause) -> None:
    # docs/security.md: "Every JSON file you give autopipe (plans, profiles, emit's `manifest.json`"
    path = _bad_file(tmp_path, reader, cause)
    with pytest.raises(reader.error) as info:
        _within_limit(lambda: reader.api(path))
    message = str(info.value)
    assert "\n" not in message and message.startswith(_expected(path, reader, cause)), message


@pytest.mark.parametrize("cause", CAUSES, ids=[c.name for c in CAUSES])
@pytest.mark.parametrize("reader", READERS, ids=[r.name for r in READERS])
def test_every_command_that_reads_the_file_exits_2_with_that_line(
    tmp_path: Path, reader: Reader, cause: Cause, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "store"))  # never the user's
    path = _bad_file(tmp_path, reader, cause)
    for command in reader.commands:
        argv = command(path, tmp_path)
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = _within_limit(lambda: main(argv))  # noqa: B023 (called at once, in this iteration)
        lines = err.getvalue().splitlines()
        assert code == 2 and len(lines) == 1, (argv, code, err.getvalue()[:500])
        assert lines[0].startswith("autopipe: error: ") and _expected(path, reader, cause) in lines[0], lines
        assert not (tmp_path / "p.json").exists() and not (tmp_path / "out").exists()


def test_good_files_still_read_and_the_limits_are_the_documented_ones(tmp_path: Path) -> None:
    assert Profile.load(PROFILE).num_blocks == 3
    nested = {"a": [{"b": [[['\\"[[[[' * 40]]]}]}  # brackets and escaped quotes in a string count for nothing
    assert parse_json(json.dumps(nested), "x", "a plan", PlanFileError, "again") == nested
    deepest = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(deepest, "x", "a plan", PlanFileError, "again") is not None
    with pytest.raises(PlanFileError, match=r"^x is not a plan \(nested more than 64 deep\); again$"):
        parse_json("[" + deepest + "]", "x", "a plan", PlanFileError, "again")
    assert parse_json("9" * MAX_JSON_DIGITS, "x", "a plan", PlanFileError, "again") == int("9" * MAX_JSON_DIGITS)
    assert parse_json(b'{"a": 1}', "x", "a plan", PlanFileError, "again") == {"a": 1}
    with pytest.raises(PlanFileError, match=r"^x is not a plan \(not UTF-8 text\); again$"):
        parse_json(b'"\xff"', "x", "a plan", PlanFileError, "again")
    with pytest.raises(ProfileError, match=r"^profile is not a profile \(a NoneType, not JSON text\); give a"):
        Profile.from_json(None)  # type: ignore[arg-type]
    with pytest.raises(PlanFileError, match=r"^x is not a plan \(more than 1000 digits in a row\); again$"):
        parse_json("9" * (MAX_JSON_DIGITS + 1), "x", "a plan", PlanFileError, "again")


def test_directories_missing_files_and_non_paths_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(PlanFileError, match=f"^{tmp_path} is a directory, not a plan; give a plan written by"):
        Plan.load(tmp_path)
    with pytest.raises(ProfileError, match=f"^profile file not found: {tmp_path}/none.json; make one with"):
        Profile.load(tmp_path / "none.json")
    for bad, said in ((None, "None"), (123, "an int")):
        expected = rf"^Plan.load's path must be the path of a plan JSON \(a str or a Path\), not {said}$"
        with pytest.raises(PlanFileError, match=expected):
            Plan.load(bad)  # type: ignore[arg-type]
    if os.path.exists("/dev/null"):
        with pytest.raises(DeviceError, match=r"^/dev/null is a character device, not a cluster file;"):
            read_cluster_file("/dev/null")


@pytest.fixture
def emitted(tmp_path: Path) -> Path:
    folder = tmp_path / "stages"
    emit(even_plan("mlp.py"), folder)
    return folder


def test_merge_refuses_a_manifest_that_is_a_symlink_out_of_the_folder(emitted: Path, tmp_path: Path) -> None:
    """The weights are read only from inside the folder (tests/stages/test_merge.py), and so is the
    manifest that names them: a link to one elsewhere is refused before it is read."""
    # docs/security.md: "`merge` reads only from inside the folder"
    outside = tmp_path / "elsewhere" / "manifest.json"
    outside.parent.mkdir()
    shutil.move(emitted / "manifest.json", outside)
    os.symlink(outside, emitted / "manifest.json")
    message = f"{emitted}/manifest.json is a symbolic link out of the folder; merge reads only files inside {emitted}"
    with pytest.raises(EmitError, match=f"^{message}"):
        merge_state_dict(emitted)
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["merge", str(emitted), "-o", str(tmp_path / "m.pt")]) == 2
    assert err.getvalue().count("\n") == 1 and message in err.getvalue()
    assert not (tmp_path / "m.pt").exists()
    os.unlink(emitted / "manifest.json")  # a link inside the folder is the folder's own file
    (emitted / "real").mkdir()
    shutil.move(outside, emitted / "real" / "manifest.json")
    os.symlink(emitted / "real" / "manifest.json", emitted / "manifest.json")
    assert merge_state_dict(emitted)


def test_the_plan_reader_still_names_the_field(tmp_path: Path) -> None:
    raw = json.loads((FIXTURES / "good_mlp_plan_v1.json").read_text())
    raw["recipe"] = {**raw.get("recipe", {}), "model_file": str(ROOT / "tests/fixtures/good_mlp.py")}
    raw["micro_batches"] = 10**400  # 401 digits: within the reader's limits, so the field is named
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanFileError, match="micro_batches"):
        Plan.load(path)


@pytest.mark.parametrize("cause", CAUSES, ids=[c.name for c in CAUSES])
def test_device_files_named_by_the_environment_go_through_the_reader(
    tmp_path: Path, cause: Cause, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "devices.json"
    cause.write(path)
    monkeypatch.setenv("AUTOPIPE_DEVICES", str(path))
    expected = _expected(path, READERS[4], cause)
    with pytest.raises(DeviceError) as info:
        _within_limit(lambda: device_spec("h100"))
    assert str(info.value).startswith(expected), str(info.value)
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = _within_limit(lambda: main(["plan", MLP, "--device", "h100", "-o", str(tmp_path / "p.json")]))
    assert code == 2 and err.getvalue().count("\n") == 1 and expected in err.getvalue(), err.getvalue()
