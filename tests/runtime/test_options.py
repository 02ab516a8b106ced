"""The run flags are defined once: ``autopipe run`` and ``python -m autopipe.runtime`` take the
same flags with the same defaults, and the launcher's arguments read back as its options."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from autopipe.cli.main import build_parser as cli_parser
from autopipe.cli.main import main

from autopipe.errors import RunOptionError
from autopipe.runtime.__main__ import build_parser as rank_parser
from autopipe.runtime.options import DEFAULT_STEPS, RunOptions, run_options, worker_arguments

ONLY_RUN = {"--json", "--plot"}  # autopipe run prints a report and draws the losses; a rank does neither
ONLY_RANK = {"--result-dir"}  # hidden: where a launched rank writes its result


def _run_subparser() -> argparse.ArgumentParser:
    commands = next(a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = commands.choices["run"]
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def _flags(parser: argparse.ArgumentParser, leave_out: set[str]) -> dict[str, tuple[object, ...]]:
    """Each flag (or positional) -> what a user sees of it: default, choices, nargs, kind."""
    out = {}
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        name = a.option_strings[-1] if a.option_strings else a.dest
        if name not in leave_out:
            out[name] = (a.dest, a.default, a.choices, a.nargs, type(a).__name__)
    return out


def test_autopipe_run_and_the_rank_entry_point_have_the_same_flags_and_defaults() -> None:
    run, rank = _run_subparser(), rank_parser()
    assert _flags(run, ONLY_RUN) == _flags(rank, ONLY_RANK)
    assert set(_flags(run, set())) - set(_flags(rank, set())) == ONLY_RUN
    assert set(_flags(rank, set())) - set(_flags(run, set())) == ONLY_RANK


def test_both_read_the_same_options_from_the_same_flags() -> None:
    argv = ["plan.json"]
    via_run = run_options(_run_subparser().parse_args(argv))
    via_rank = run_options(rank_parser().parse_args(argv))
    assert via_run == via_rank
    assert via_run.steps == DEFAULT_STEPS == 10 and via_run.device in ("cpu", "cuda")
    argv = ["p.json", "--steps", "3", "--seed", "7", "--lr", "0.5", "--timeout", "2", "--device", "cpu", "--threads", "2",
            "--optimizer", "SGD", "--optimizer-arg", "momentum=0.9"]  # fmt: skip
    via_run = run_options(_run_subparser().parse_args(argv))
    assert via_run == run_options(rank_parser().parse_args(argv))
    assert (via_run.steps, via_run.seed, via_run.lr, via_run.timeout_s, via_run.threads) == (3, 7, 0.5, 2.0, 2)
    assert via_run.optimizer_kwargs == (("momentum", 0.9),)


def test_the_launchers_arguments_read_back_as_its_options(tmp_path: Path) -> None:
    options = RunOptions(
        steps=3, seed=2, optimizer="SGD", lr=0.05, optimizer_kwargs=(("momentum", 0.9), ("nesterov", 1.0)),
        timeout_s=2.5, device="cpu", threads=2, save_checkpoint="ck", resume="old",
    )  # fmt: skip
    plan = tmp_path / "plan.json"
    back = run_options(rank_parser().parse_args(worker_arguments(str(plan), options)))
    assert back == dataclasses.replace(options, model_base=str(tmp_path.resolve()))
    # Every option is explicit, so a launched rank never takes a flag's default (RunOptions'
    # defaults are one step on the CPU, the flags' ten steps on CUDA when available).
    default = run_options(rank_parser().parse_args(worker_arguments(str(plan), RunOptions())))
    assert (default.steps, default.device) == (1, "cpu")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps must be a positive integer (got 0)"),
        (["--steps", "ten"], "--steps must be a positive integer (got 'ten')"),
        (["--seed", "-1"], "--seed must be an integer >= 0 (got -1)"),
        (["--lr", "fast"], "--lr must be a number (got 'fast')"),
        (["--threads", "0"], "--threads must be a positive integer (got 0)"),
        (["--timeout", "soon"], "--timeout must be a number with a unit"),
        (["--optimizer-arg", "momentum=high"], "--optimizer-arg momentum=high: the value must be a number, like momentum=0.9"),
        (["--optimizer-arg", "momentum"], "--optimizer-arg 'momentum': write it as KEY=VALUE"),
    ],
)
def test_bad_run_flags_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RunOptionError) as info:
        run_options(rank_parser().parse_args(["plan.json", *argv]))
    assert message in str(info.value)
    assert main(["run", "plan.json", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
