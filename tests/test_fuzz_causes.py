"""Fuzz by root cause: each cause of issue 23, through every command that has it.

tests/test_fuzz.py mutates good files at random; this module is the table: for each root cause
(a JSON file every reader must refuse, an output path the writer must not replace or fail on,
a numeric flag past its bound, a plan string that would reach another program or the terminal,
a read outside a folder, a pickle carrying code, a too-small micro-batch for BatchNorm) the
commands that meet it, run in this process (:func:`tests.helpers.call`, 60 s per case: only a
hang meets it). A refused case must end with exit 2 and exactly one ``autopipe: error:`` line
that says ``says``, and leave every file of the test's folder as it was (names, sizes, hashes)
with nothing new. ``run`` stops at the launcher (swapped, as in test_fuzz.py): a case that
reaches it got past the checks that should have refused it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import autopipe.runtime.run.launch
from autopipe.plans import Plan
from autopipe.units import COUNT_BOUNDS
from tests.helpers import FIXTURES, Launched, Outcome, call

MLP = FIXTURES / "good_mlp.py"
PLAN_V1 = FIXTURES / "good_mlp_plan_v1.json"
PROFILE_V1 = FIXTURES / "good_mlp_profile_v1.json"


@dataclass(frozen=True)
class Case:
    cause: str
    command: str
    argv: list[str]
    says: str  # in the one line
    keeps: str = ""  # a file the case writes before its error, and whose line says so


def snapshot(folder: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``folder``: its kind, size and content hash (links by their target)."""
    seen: dict[str, tuple[str, int, str]] = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            seen[rel] = ("link", 0, os.readlink(p))
        elif p.is_file():
            seen[rel] = ("file", p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            seen[rel] = ("dir" if p.is_dir() else "special", 0, "")
    return seen


class _Code:
    """A pickle that would run ``os.system`` when loaded without weights_only."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, ("touch RAN",))


def _function() -> None:
    pass


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good plan, profile and emitted folder, and the bad files each cause needs, all made once."""
    w = tmp_path_factory.mktemp("causes")
    plan = json.loads(Plan.load(PLAN_V1).to_json())
    plan["recipe"]["model_file"] = str(MLP)
    (w / "plan.json").write_text(json.dumps(plan))
    profile = json.loads(PROFILE_V1.read_text())
    profile["model_file"] = str(MLP)
    (w / "profile.json").write_text(json.dumps(profile))
    assert call(["emit", str(w / "plan.json"), "-o", str(w / "stages")]).code == 0
    bad = w / "bad"
    bad.mkdir()
    for kind in ("plan", "profile", "manifest", "devices", "cluster", "calibration"):  # every JSON reader
        (bad / f"{kind}-deep.json").write_text("[" * 200_000 + "]" * 200_000)
        (bad / f"{kind}-digits.json").write_text('{"version": ' + "7" * 5000 + "}")
        (bad / f"{kind}-bytes.json").write_bytes(b'{"model": "\xff\xfe"}')
        os.mkfifo(bad / f"{kind}-fifo.json")
        (bad / f"{kind}-folder.json").mkdir()
    for how in ("deep", "digits", "bytes"):  # a stage folder whose manifest is bad
        folder = bad / f"stages-{how}"
        _copy_stages(w / "stages", folder)
        (folder / "manifest.json").unlink()
        (folder / "manifest.json").write_bytes((bad / f"manifest-{how}.json").read_bytes())
    outside = bad / "stages-manifest-link"  # reads outside the folder
    _copy_stages(w / "stages", outside)
    (bad / "elsewhere.json").write_bytes((outside / "manifest.json").read_bytes())
    (outside / "manifest.json").unlink()
    (outside / "manifest.json").symlink_to(bad / "elsewhere.json")
    for name, obj in (("code", _Code()), ("function", _function)):  # pickles that carry code
        folder = bad / f"stages-pickle-{name}"
        _copy_stages(w / "stages", folder)
        weights = folder / "stage0" / "weights.pt"
        if name == "code":
            weights.write_bytes(pickle.dumps(obj, protocol=2))
        else:
            torch.save({"x": obj}, weights)
        (bad / f"weights-{name}.pt").write_bytes(weights.read_bytes())
    strings = dict(plan, model="m\n--save /tmp/owned\n[parallelism]\n\x1b]0;title\x07\x1b[31m[/]red")
    (bad / "plan-strings.json").write_text(json.dumps(strings))
    (bad / "profile-markup.json").write_text(json.dumps(dict(profile, model="[/] [bold]x[/bold]")))
    for suffix in ("json", "png", "pt", "txt", "csv"):  # a full disk: a link to /dev/full is written through
        (bad / f"full.{suffix}").symlink_to("/dev/full")
    return w


def _copy_stages(src: Path, dst: Path) -> None:
    for p in src.rglob("*"):
        if p.is_file():
            (dst / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (dst / p.relative_to(src)).write_bytes(p.read_bytes())


def _plan_from_profile(profile: Path | str, *more: str) -> list[str]:
    return ["plan", "--profile", str(profile), "--stages", "2", "--batch-size", "8", *more]


def json_cases(w: Path) -> Iterator[Case]:
    """Every JSON reader (plan, profile, manifest, device, cluster, calibration files) through every
    command that reads it: too deep, too many digits, not UTF-8, a FIFO, a folder."""
    out = str(w / "out")
    says = {"deep": "nested", "digits": "digits", "bytes": "UTF-8", "fifo": "FIFO", "folder": "folder"}
    for how, word in says.items():
        b = w / "bad"
        plan = str(b / f"plan-{how}.json")
        for command, argv in (
            ("show", ["show", plan]),
            ("emit", ["emit", plan, "-o", out]),
            ("run", ["run", plan, "--steps", "1"]),
            ("config", ["config", plan, "--for", "megatron"]),
        ):
            yield Case(f"plan file {how}", command, argv, word)
        profile = str(b / f"profile-{how}.json")
        yield Case(f"profile file {how}", "plan", _plan_from_profile(profile, "-o", out), word)
        yield Case(f"profile file {how}", "calibrate", ["calibrate", profile, "--model", str(MLP), "-o", out], word)
        for kind, flag in (("devices", "--device-file"), ("cluster", "--cluster"), ("calibration", "--calibration")):
            extra = ["--analytic", "--gpus", "2"] if kind == "cluster" else ["--analytic", "--stages", "2"]
            argv = ["plan", str(MLP), "--batch-size", "8", *extra, flag, str(b / f"{kind}-{how}.json")]
            yield Case(f"{kind} file {how}", "plan", [*argv, "-o", out], word)
        if how in ("deep", "digits", "bytes"):
            yield Case(f"manifest {how}", "merge", ["merge", str(b / f"stages-{how}"), "-o", out], word)


def output_cases(w: Path) -> Iterator[Case]:
    """Every output flag: a folder given for a file, a name too long for the file system, a full disk."""
    long = str(w / ("x" * 300))
    folder = str(w / "stages")
    full = w / "bad" / "full"
    plan, profile = str(w / "plan.json"), str(w / "profile.json")
    for what, target, says in ((("folder", folder, "directory")), ("long name", long, "too long")):
        yield Case(
            f"-o {what}",
            "plan",
            _plan_from_profile(profile, "-o", target + ("" if what == "folder" else ".json")),
            says,
        )
    yield Case("full disk", "plan -o", _plan_from_profile(profile, "-o", f"{full}.json"), "No space left")
    timeline = _plan_from_profile(profile, "-o", str(w / "kept.json"), "--timeline", f"{full}.png")
    yield Case("full disk", "plan --timeline", timeline, f"wrote {w / 'kept.json'}, but cannot write", "kept.json")
    yield Case("full disk", "show --timeline", ["show", plan, "--timeline", f"{full}.png"], "No space left")
    yield Case("full disk", "config -o", ["config", plan, "--for", "megatron", "-o", f"{full}.txt"], "No space left")
    yield Case("full disk", "merge -o", ["merge", folder, "-o", f"{full}.pt"], "No space left")
    yield Case("long name", "merge -o", ["merge", folder, "-o", long + ".pt"], "too long")
    yield Case("long name", "emit -o", ["emit", plan, "-o", long], "too long")
    yield Case("long name", "run --trace", ["run", plan, "--steps", "1", "--trace", long + ".json"], "too long")
    yield Case("long name", "config -o", ["config", plan, "--for", "megatron", "-o", long + ".txt"], "too long")
    yield Case("a file for a folder", "emit -o", ["emit", plan, "-o", plan], "not a folder")
    yield Case("long name", "emit --schedule-csv", ["emit", plan, "--schedule-csv", long + ".csv"], "too long")
    yield Case("full disk", "emit --schedule-csv", ["emit", plan, "--schedule-csv", f"{full}.csv"], "No space left")
    yield Case("long name", "profile -o", ["profile", str(MLP), "--batch-size", "2", "-o", long + ".json"], "too long")
    yield Case(
        "long name", "calibrate -o", ["calibrate", profile, "--model", str(MLP), "-o", long + ".json"], "too long"
    )
    for flag, suffix in (("--plot", ".png"), ("--save-checkpoint", "")):
        argv = ["run", plan, "--steps", "1", flag, long + suffix]
        yield Case("long name", f"run {flag}", argv, "too long" if flag == "--plot" else "longer than")
        yield Case("long name inside", f"run {flag}", [*argv[:-1], long + "/x" + suffix], "long")


_COUNT_FLAGS = {  # COUNT_BOUNDS's field -> the commands whose flag sets it
    "threads": ("profile", "plan", "run"),
    "warmup": ("profile", "plan"),
    "repeat": ("profile", "plan"),
    "steps": ("run",),
}


def flag_cases(w: Path) -> Iterator[Case]:
    """Every counted flag of every command, at 0, -1, its bound + 1, 2**64, nan and 1e11."""
    assert set(_COUNT_FLAGS) == set(COUNT_BOUNDS), "a new bound in units.py: name its commands here"
    base = {
        "profile": ["profile", str(MLP), "--batch-size", "2", "-o", str(w / "out.json")],
        "plan": ["plan", str(MLP), "--stages", "2", "--batch-size", "8", "-o", str(w / "out.json")],
        "run": ["run", str(w / "plan.json")],
    }
    for field, commands in _COUNT_FLAGS.items():
        low, high = COUNT_BOUNDS[field]
        for value in ("0", "-1", str(high + 1), str(2**64), "nan", "1e11"):
            if value.lstrip("-").isdigit() and low <= int(value) <= high:
                continue
            for command in commands:
                yield Case(f"--{field} {value}", command, [*base[command], f"--{field}", value], f"--{field}")
    for value in ("-1", "nan", "inf", "1e11", "x"):  # the model-file time limit, on each command that has it
        for command, argv in (*base.items(), ("emit", ["emit", str(w / "plan.json"), "-o", str(w / "out")])):
            yield Case(f"--load-timeout {value}", command, [*argv, "--load-timeout", value], "--load-timeout")


def place_cases(w: Path) -> Iterator[Case]:
    """Reads outside a folder, and pickles that carry code, refused in words that say so."""
    b = w / "bad"
    out = str(w / "merged.pt")
    yield Case("manifest a link out", "merge", ["merge", str(b / "stages-manifest-link"), "-o", out], "link")
    for name in ("code", "function"):
        says = "pickled objects other than tensors"
        yield Case(f"pickled {name}", "merge", ["merge", str(b / f"stages-pickle-{name}"), "-o", out], says)
        argv = ["emit", str(w / "plan.json"), "--weights", str(b / f"weights-{name}.pt"), "-o", str(w / "out")]
        yield Case(f"pickled {name}", "emit --weights", argv, "holds pickled Python objects or code")


def all_cases(w: Path) -> list[Case]:
    return [*json_cases(w), *output_cases(w), *flag_cases(w), *place_cases(w)]


def _problem(case: Case, outcome: Outcome) -> str | None:
    if (problem := outcome.problem()) is not None:
        return problem
    if outcome.code != 2:
        return f"exit {outcome.code}, not refused"
    if case.says.lower() not in outcome.err.lower():
        return f"the line does not say {case.says!r}: {outcome.err.strip()[:300]!r}"
    if "Traceback" in outcome.err:
        return "a traceback"
    return None


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    def launched(*args: object, **kwargs: object) -> None:
        raise Launched()

    monkeypatch.setattr(autopipe.runtime.run.launch, "launch", launched)


def _slow(case: Case) -> bool:
    return "--timeline" in case.argv  # drawing imports matplotlib: seconds


def test_every_cause_through_every_command(world: Path, no_launch: None) -> None:
    cases = [c for c in all_cases(world) if not _slow(c)]
    assert len(cases) >= 120
    check(world, cases)


@pytest.mark.slow
def test_every_cause_through_drawing_commands(world: Path, no_launch: None) -> None:
    cases = [c for c in all_cases(world) if _slow(c)]
    assert len(cases) >= 2
    check(world, cases)


def check(world: Path, cases: list[Case]) -> None:
    failures = []
    for case in cases:
        before = snapshot(world)
        outcome = call(case.argv)
        problem = _problem(case, outcome)
        after = snapshot(world)
        if problem is None and case.keeps:
            kept = after.pop(case.keeps, None)
            (world / case.keeps).unlink(missing_ok=True)
            problem = None if kept is not None and kept[0] == "file" else f"{case.keeps} not written"
        if problem is None and after != before:
            changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
            problem = f"files changed or left behind: {changed[:5]}"
        if problem is not None:
            failures.append(f"{case.cause} / {case.command}: {problem}")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)


# ----------------------------------------------------------------------------- what succeeds must stay safe


def test_plan_strings_reach_no_other_program_and_no_terminal(world: Path) -> None:
    """A plan's ``model`` string with newlines, terminal escapes and rich markup, through every command
    that prints or generates text from it: it stays one escaped value (no new Megatron argument, no
    second TOML table, no escape sequence, no markup error)."""
    plan = str(world / "bad" / "plan-strings.json")
    before = snapshot(world)
    for argv in (
        ["show", plan],
        ["show", plan, "--json"],
        ["config", plan, "--for", "megatron"],
        ["config", plan, "--for", "torchtitan-0.2"],
        ["config", plan, "--for", "torchtitan"],
    ):
        outcome = call(argv)
        assert outcome.code == 0 and outcome.err == "", (argv, outcome)
        assert "\x1b" not in outcome.out and "\x07" not in outcome.out, argv
        if argv[0] == "config":  # the generated formats (show's tables keep a name's newline: text, not code)
            lines = outcome.out.splitlines()
            assert not [line for line in lines if line.startswith("--save")], argv
            assert sum(line.strip() == "[parallelism]" for line in lines) <= 1, argv
    markup = call(_plan_from_profile(world / "bad" / "profile-markup.json", "-o", str(world / "marked.json")))
    assert markup.code == 0 and "[/] [bold]x[/bold]" in markup.out, markup
    (world / "marked.json").unlink()
    assert snapshot(world) == before


def test_a_profile_is_data_to_calibrate(world: Path, tmp_path: Path) -> None:
    """calibrate PROFILE never imports the model file PROFILE names (code from data): a crafted
    profile naming a file that would write a marker, with and without --model."""
    model = tmp_path / "marker.py"
    model.write_text("from pathlib import Path\nPath(__file__).with_name('RAN').write_text('x')\n")
    crafted = tmp_path / "profile.json"
    crafted.write_text(json.dumps(dict(json.loads(PROFILE_V1.read_text()), model_file=str(model))))
    refused = call(["calibrate", str(crafted), "-o", str(tmp_path / "cal.json")])
    assert refused.code == 2 and "--model" in refused.err and refused.problem() is None, refused
    fitted = call(["calibrate", str(crafted), "--model", str(MLP), "-o", str(tmp_path / "cal.json")])
    assert fitted.problem() is None, fitted
    assert not (tmp_path / "RAN").exists()


def test_the_api_says_the_same_in_typed_errors(world: Path) -> None:
    """The readers behind the commands, called from Python: the typed error and its one line."""
    from autopipe.costs.profile import Profile
    from autopipe.errors import EmitError, PlanFileError, ProfileError
    from autopipe.stages.merge import merge_state_dict

    b = world / "bad"
    for call_it, error, says in (
        (lambda: Plan.load(b / "plan-deep.json"), PlanFileError, "nested"),
        (lambda: Plan.load(b / "plan-fifo.json"), PlanFileError, "FIFO"),
        (lambda: Profile.load(b / "profile-bytes.json"), ProfileError, "UTF-8"),
        (lambda: Profile.load(b / "profile-digits.json"), ProfileError, "digits"),
        (lambda: merge_state_dict(b / "stages-manifest-link"), EmitError, "link"),
        (lambda: merge_state_dict(b / "stages-pickle-code"), EmitError, "pickled objects other than tensors"),
    ):
        with pytest.raises(error) as info:
            call_it()
        assert says.lower() in str(info.value).lower() and "\n" not in str(info.value), str(info.value)


# ----------------------------------------------------------------------------- user code and signals

BATCHNORM = """\
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def example_inputs(batch_size):
    return torch.randn(batch_size, 8)
"""


@pytest.mark.slow
def test_a_micro_batch_of_one_for_batchnorm_is_one_line(tmp_path: Path) -> None:
    """Training-mode BatchNorm at one sample per micro-batch, through the commands that run the model at
    that size: the line blames the micro-batch, not tracing (no --leaf advice), and says what to change."""
    model = tmp_path / "bn.py"
    model.write_text(BATCHNORM)
    before = snapshot(tmp_path)
    for argv in (
        [
            "plan",
            str(model),
            "--stages",
            "2",
            "--batch-size",
            "4",
            "--micro-batches",
            "4",
            "-o",
            str(tmp_path / "p.json"),
        ],
        ["profile", str(model), "--batch-size", "1", "-o", str(tmp_path / "profile.json")],
    ):
        outcome = call(argv)
        assert outcome.code == 2 and outcome.problem() is None, outcome
        assert "the micro-batch is too small for BatchNorm" in outcome.err and "--leaf" not in outcome.err
        assert "plan with a larger micro-batch (fewer --micro-batches" in outcome.err
    assert snapshot(tmp_path) == before


SLEEPY = "import time\nfrom pathlib import Path\n\nPath(__file__).with_name('STARTED').touch()\ntime.sleep(120)\n"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_while_user_code_runs(sig: signal.Signals, tmp_path: Path) -> None:
    """Ctrl-C while the model file runs: exit 130, one line; SIGTERM: exit 143, one line, after the
    command's cleanups ran (cli/main.py raises errors.Terminated). Either way nothing is
    written (the real process: a signal cannot be sent to this one)."""
    (tmp_path / "model").mkdir()
    (tmp_path / "out").mkdir()
    model = tmp_path / "model" / "sleepy.py"
    model.write_text(SLEEPY)
    argv = ["plan", str(model), "--stages", "2", "--batch-size", "4", "-o", str(tmp_path / "out" / "p.json")]
    proc = subprocess.Popen([sys.executable, "-m", "autopipe.cli.main", *argv], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (tmp_path / "model" / "STARTED").exists():
            time.sleep(0.05)
        time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and err == "autopipe: interrupted\n", (proc.returncode, err)
    else:
        assert proc.returncode == 143 and err == "autopipe: terminated\n", (proc.returncode, err)
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("name", ["code", "function"])
def test_a_checkpoint_file_carrying_code_says_so(world: Path, name: str) -> None:
    """A pickle carrying code (``os.system``, torch 2.13's 'blocked module' wording, or a function) in a
    checkpoint's stage file: refused as holding Python objects, not called truncated."""
    from autopipe.errors import RuntimeFailure
    from autopipe.runtime.checkpoint import load_file

    path = world / "bad" / f"weights-{name}.pt"
    with pytest.raises(RuntimeFailure) as info:
        load_file(path)
    assert str(info.value) == (
        f"{path} is not a valid checkpoint file (it holds Python objects, not only tensors and numbers; "
        "not loaded, as that could run code); save the checkpoint again with --save-checkpoint"
    )


@pytest.mark.slow
def test_stdout_on_a_full_device_is_one_line(world: Path) -> None:
    """A full disk under stdout (``> /dev/full``), for the commands that print their result: exit 1
    (a fault, not bad input), one line, no traceback."""
    plan = str(world / "plan.json")
    for argv in (["show", plan, "--json"], ["config", plan, "--for", "megatron"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                [sys.executable, "-m", "autopipe.cli.main", *argv],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
            )
        assert done.returncode == 1 and done.stderr.count("\n") == 1, (argv, done.stderr)
        assert done.stderr.startswith("autopipe: error: cannot write the output: No space left on device")


@pytest.mark.slow
def test_sigterm_at_any_moment_of_an_emit_leaves_no_half_written_folder(tmp_path: Path) -> None:
    """SIGTERM across an emit (before, while tracing, while writing stages): exit 143 and one line,
    or the emit finished first; the output folder is there whole or not at all, and emit's
    temporary folder never stays behind (Terminated runs its cleanup)."""
    from tests.helpers import even_plan

    even_plan("gpt.py", ["n_layer=4"], stages=2).save(tmp_path / "plan.json")
    argv = [sys.executable, "-m", "autopipe.cli.main", "emit", str(tmp_path / "plan.json")]

    def emit(out: Path, after: float | None) -> tuple[int, str]:
        proc = subprocess.Popen([*argv, "-o", str(out / "stages")], stderr=subprocess.PIPE, text=True)
        try:
            if after is not None:
                time.sleep(after)
                proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        return proc.returncode, err

    start = time.monotonic()
    (tmp_path / "whole").mkdir()
    assert emit(tmp_path / "whole", None)[0] == 0
    took = time.monotonic() - start
    outcomes = set()
    for i, share in enumerate((0.3, 0.6, 0.85, 0.97)):
        out = tmp_path / f"killed{i}"
        out.mkdir()
        code, err = emit(out, took * share)
        outcomes.add(code)
        left = sorted(p.name for p in out.iterdir())
        if code == 143:
            assert err == "autopipe: terminated\n" and left == [], (share, err, left)
        else:
            # finished first; -15: the signal came as Python exited, after main() put SIGTERM's default back
            assert code in (0, -signal.SIGTERM) and left == ["stages"], (share, code, err, left)
            assert (out / "stages" / "manifest.json").is_file()
    assert 143 in outcomes  # the signal did land mid-emit at least once
