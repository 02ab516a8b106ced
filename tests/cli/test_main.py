"""The command line: one-line errors and exit codes, version, the profile command."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from autopipe.cli.common import ProfilingOptions
from autopipe.cli.main import build_parser, main

import autopipe.api
from autopipe.costs.profile import Profile
from autopipe.graph.recipe import TraceRecipe
from autopipe.model.load import LoadedModel
from tests.helpers import hand_profile

torch.set_num_threads(1)

GOOD = "tests/fixtures/good_mlp.py"
ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("autopipe: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "parts"),
    [
        (["profile", "tests/fixtures/missing.py"], ["model file not found: tests/fixtures/missing.py"]),
        (["profile", "tests/fixtures/bad_syntax.py"], ["syntax error in tests/fixtures/bad_syntax.py:7:"]),
        (["profile", "tests/fixtures/no_factory.py"], ["has no function 'build_model'"]),
        (["profile", GOOD, "-k", "width"], ["factory argument 'width' has no '='"]),
        (["profile", GOOD, "-k", "widht=3"], ["build_model() does not take widht"]),
        (
            ["profile", "tests/fixtures/rejects_inputs.py"],
            ["the model rejected its example inputs", "rejects_inputs.py:15)"],
        ),
        (["profile", GOOD, "--batch-size", "0"], ["--batch-size must be a positive integer (got 0)"]),
        (["profile", GOOD, "--batch-size", "-3"], ["--batch-size must be a positive integer (got -3)"]),
        (["profile", GOOD, "--batch-size", "eight"], ["--batch-size must be a positive integer (got 'eight')"]),
        (["profile", GOOD, "--micro-batch-sizes", "1,x"], ["--micro-batch-sizes must be positive integers", "'1,x'"]),
        (["profile", GOOD, "--micro-batch-sizes", "0,2"], ["--micro-batch-sizes must be positive integers"]),
        (["profile", GOOD, "--micro-batch-sizes", "4,16,32"], ["--micro-batch-sizes 16,32 larger than --batch-size 8"]),
        (["profile", GOOD, "--repeat", "0"], ["--repeat must be a positive integer"]),
        (["profile", GOOD, "--warmup", "-1"], ["--warmup must be an integer >= 0"]),
        (["profile", GOOD, "--warmup", "100000000000"], ["--warmup must be from 0 to 1000 (got 100000000000)"]),
        (["profile", GOOD, "--repeat", "5000"], ["--repeat must be from 1 to 1000 (got 5000)"]),
        (["profile", GOOD, "--threads", "100000"], ["--threads must be from 1 to 1024 (got 100000)"]),
        (["plan", GOOD, "--threads", str(2**64)], [f"--threads must be from 1 to 1024 (got {2**64})"]),
        (["run", "plan.json", "--threads", "5000"], ["--threads must be from 1 to 1024 (got 5000)"]),
        (["profile", GOOD, "--device", "tpu"], ["--device must be cpu, cuda or cuda:N"]),
        (["profile", GOOD, "-o", "no/such/dir/p.json"], ["folder no/such/dir does not exist"]),
    ],
)
def test_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], parts: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    line = one_error_line(err)
    for part in parts:
        assert part in line, line


@pytest.mark.parametrize("memory", [["--memory", "-5GB"], ["--memory=-5GB"], ["--memory", "-.5GB"]])
def test_negative_looking_values_are_values(
    capsys: pytest.CaptureFixture[str], memory: list[str], tmp_path: Path
) -> None:
    code, _, err = run(
        capsys, "plan", "--profile", str(tmp_path / "none.json"), *memory, "-o", str(tmp_path / "p.json")
    )
    assert code == 2
    assert (
        one_error_line(err)
        == f"autopipe: error: --memory must be positive (got {memory[-1].removeprefix('--memory=')!r})"
    )
    code, _, err = run(
        capsys, "plan", "--profile", str(tmp_path / "none.json"), "--memory", "1e400GB", "-o", str(tmp_path / "p.json")
    )
    assert (
        one_error_line(err)
        == "autopipe: error: --memory must be a finite number (got '1e400GB'); write it like 16GiB or 80GB"
    )


def test_argparse_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "profile")[0] == 2  # MODEL missing
    assert run(capsys, "profile", GOOD, "--tracer", "jit")[0] == 2
    assert run(capsys, "frobnicate")[0] == 2
    assert run(capsys)[0] == 2  # no command
    code, _, err = run(capsys, "show")  # one line, with where to look, not the usage block
    assert (
        code == 2 and err == "autopipe: error: the following arguments are required: PLAN; see 'autopipe show --help'\n"
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == "autopipe 0.1.0"


def test_keyboard_interrupt_exits_130(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(loaded: LoadedModel, **options: object) -> Profile:
        raise KeyboardInterrupt

    monkeypatch.setattr(autopipe.api, "profile_model", interrupted)
    code, _, err = run(capsys, "profile", GOOD, "--device", "cpu")
    assert code == 130 and "interrupted" in err


def test_other_exceptions_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(loaded: LoadedModel, **options: object) -> Profile:
        raise RuntimeError("a bug in autopipe")

    monkeypatch.setattr(autopipe.api, "profile_model", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["profile", GOOD, "--device", "cpu"])


@pytest.mark.slow
def test_subprocess_missing_file() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "autopipe.cli.main", "profile", "tests/fixtures/missing.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"autopipe: error: model file not found: tests/fixtures/missing.py (looked relative to {ROOT}); check the path"
    ]


@pytest.fixture
def fake_profiler(monkeypatch: pytest.MonkeyPatch) -> list[ProfilingOptions]:
    """Replace the profiler call (``autopipe.api.profile``'s); record the options it received."""
    calls: list[ProfilingOptions] = []

    def fake(
        loaded: LoadedModel,
        *,
        micro_batch_sizes: tuple[int, ...],
        recipe: TraceRecipe,
        warmup: int,
        repeat: int,
        device: str,
        progress: object,
        threads: int,
        executor: object,
    ) -> Profile:
        assert isinstance(loaded, LoadedModel)
        assert executor is autopipe.api.executor_probe  # the executor's costs measured too (issue 28)
        calls.append(
            ProfilingOptions(
                micro_batch_sizes,
                recipe.tracer,
                recipe.leaf_modules,
                recipe.max_blocks,
                warmup,
                repeat,
                device,
                threads,
            )
        )
        return hand_profile()

    monkeypatch.setattr(autopipe.api, "profile_model", fake)
    return calls


def test_profile_table_and_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_profiler: list[ProfilingOptions]
) -> None:
    out_file = tmp_path / "p.json"
    code, out, err = run(
        capsys,
        "profile",
        GOOD,
        "-k",
        "width=8",
        "-o",
        str(out_file),
        "--batch-size",
        "4",
        "--leaf",
        "MLP,Linear",
        "--leaf",
        "ReLU",
        "--blocks",
        "3",
        "--device",
        "cpu",
    )
    assert code == 0 and err == ""
    options = fake_profiler[0]
    assert options.micro_batch_sizes == (1, 2, 4) and options.leaf_modules == ("MLP", "Linear", "ReLU")
    assert (options.max_blocks, options.warmup, options.repeat, options.device, options.tracer) == (
        3,
        2,
        5,
        "cpu",
        "auto",
    )
    assert Profile.load(out_file) == hand_profile()
    assert "layers.0" in out and "head" in out and "1.50M" in out
    assert out.strip().splitlines()[-1] == f"wrote {out_file} (2 blocks, measured on cpu (1 threads))"


def test_profile_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_profiler: list[ProfilingOptions]
) -> None:
    out_file = tmp_path / "p.json"
    code, out, _ = run(
        capsys, "profile", GOOD, "-o", str(out_file), "--json", "--micro-batch-sizes", "4,1", "--device", "cpu"
    )
    assert code == 0
    summary = json.loads(out)
    assert fake_profiler[0].micro_batch_sizes == (1, 4)
    assert summary["micro_batch_size"] == 4 and summary["output"] == str(out_file)
    assert [b["name"] for b in summary["blocks"]] == ["layers.0", "head"]
    assert summary["blocks"][0]["forward_s"] == pytest.approx(4 * 0.5e-3)
    assert summary["blocks"][1]["saved_bytes"] == 4 * 2**20


@pytest.mark.slow
def test_a_closed_output_pipe_ends_quietly(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    hand_profile().save(path)
    read, write = os.pipe()
    os.close(read)  # nobody reads: the first print meets a closed pipe
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autopipe.cli.main",
            "plan",
            "--profile",
            str(path),
            "--stages",
            "2",
            "-o",
            str(tmp_path / "p.json"),
        ],
        cwd=ROOT,
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
    )
    os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


@pytest.mark.slow
def test_output_to_a_full_device_is_one_line_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    hand_profile().save(path)
    with open("/dev/full", "w") as full:  # every write: No space left on device
        proc = subprocess.run(
            [sys.executable, "-m", "autopipe.cli.main", "plan", "--profile", str(path), "--stages", "2"],
            cwd=ROOT,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert (proc.returncode, proc.stderr) == (
        1,
        "autopipe: error: cannot write the output: No space left on device; free some space or write elsewhere\n",
    )


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_and_flag_has_a_true_help_line(capsys: pytest.CaptureFixture[str]) -> None:
    flag = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
    commands = _commands()
    assert set(commands) == {"profile", "plan", "show", "emit", "merge", "run", "calibrate", "config"}
    for name, parser in commands.items():
        assert parser.description and len(parser.description) > 20, f"{name} has no description"
        own = {o for a in parser._actions for o in a.option_strings}
        texts = [parser.description] + [a.help for a in parser._actions if a.help != argparse.SUPPRESS]
        for action in parser._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        for text in texts:
            assert text is not None
            foreign = [f for f in flag.findall(text) if f not in own]
            assert not foreign, f"{name}: {text!r} mentions {foreign}, which {name} does not take"
        assert main([name, "--help"]) == 0
        assert parser.description.split()[0] in capsys.readouterr().out  # shown under usage
    device = next(a for a in commands["profile"]._actions if "--device" in a.option_strings)
    assert device.help is not None and "catalogue" not in device.help and "plan" not in device.help
