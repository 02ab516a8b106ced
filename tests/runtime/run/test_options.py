"""The run flags are defined once: ``autopipe run`` and ``python -m autopipe.runtime`` take the
same flags with the same defaults, and the launcher's arguments read back as its options."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pytest
from autopipe.cli.main import build_parser as cli_parser
from autopipe.cli.main import main

from autopipe.errors import RunOptionError
from autopipe.modes import Engine
from autopipe.runtime.run.options import DEFAULT_STEPS, RunOptions, check_launch, run_options, worker_arguments
from autopipe.runtime.run.rank import build_parser as rank_parser
from tests.runtime.helpers import fake_checkpoint

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
    argv = [
        "p.json",
        "--steps",
        "3",
        "--seed",
        "7",
        "--lr",
        "0.5",
        "--timeout",
        "2",
        "--device",
        "cpu",
        "--threads",
        "2",
        "--optimizer",
        "SGD",
        "--optimizer-arg",
        "momentum=0.9",
    ]
    via_run = run_options(_run_subparser().parse_args(argv))
    assert via_run == run_options(rank_parser().parse_args(argv))
    assert (via_run.steps, via_run.seed, via_run.lr, via_run.timeout_s, via_run.threads) == (3, 7, 0.5, 2.0, 2)
    assert via_run.optimizer_kwargs == (("momentum", 0.9),)


def test_the_launchers_arguments_read_back_as_its_options(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "old", optimizer="SGD")
    options = RunOptions(
        steps=3,
        seed=2,
        optimizer="SGD",
        lr=0.05,
        optimizer_kwargs=(("momentum", 0.9), ("nesterov", 1.0)),
        timeout_s=2.5,
        device="cpu",
        threads=2,
        save_checkpoint=str(tmp_path / "ck"),
        resume=str(tmp_path / "old"),
    )
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
        (
            ["--timeout", "soon"],
            "--timeout must be a positive number of seconds, or one with a unit, like 60 or 500ms (got 'soon')",
        ),
        (
            ["--optimizer-arg", "momentum=high"],
            "--optimizer-arg momentum=high: the value must be a number, like momentum=0.9",
        ),
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


def _checkpoint(
    folder: Path, step: int = 4, fingerprint: str = "abc", stages: int = 2, optimizer: str = "Adam"
) -> Path:
    """A checkpoint folder with a right manifest (what run_options reads of it)."""
    return fake_checkpoint(folder, step, fingerprint, stages, optimizer=optimizer)


def _flag_cases(tmp: Path) -> list[tuple[list[str], str]]:
    _checkpoint(tmp / "ck")
    (tmp / "empty").mkdir()
    (tmp / "a-file").write_text("x")
    (tmp / "bad-meta").mkdir()
    (tmp / "bad-meta" / "meta.json").write_text("{not json")
    huge = str(2**64)
    return [
        (
            ["--timeout", "0"],
            "--timeout must be more than 0 and at most 604800 seconds (a week), like 60 or 500ms (got 0 seconds)",
        ),
        (
            ["--timeout", "1e400"],
            "--timeout must be more than 0 and at most 604800 seconds (a week), like 60 or 500ms (got inf seconds)",
        ),
        (["--timeout", "inf"], "(got inf seconds)"),
        (["--timeout", "nan"], "(got nan seconds)"),
        (["--timeout", "-1"], "(got -1 seconds)"),
        (["--timeout=-5ms"], "--timeout must be a positive number of seconds, or one with a unit"),
        (["--lr", "nan"], "--lr must be a finite number >= 0, like 1e-3 (got nan)"),
        (["--lr", "inf"], "--lr must be a finite number >= 0, like 1e-3 (got inf)"),
        (["--lr", "-1"], "--lr must be a finite number >= 0, like 1e-3 (got -1)"),
        (
            ["--seed", huge],
            f"--seed must be from 0 to {2**64 - 1 - 10} with --steps 10 (got {huge}; step k seeds torch",
        ),
        (["--seed", str(2**64 - 5), "--steps", "5"], f"--seed must be from 0 to {2**64 - 6} with --steps 5"),
        (["--seed", "9" * 5000], "--seed must be an integer >= 0 (got '99999999999"),
        (["--steps", "100000000"], "--steps must be from 1 to 10000000 (got 100000000); run longer as several runs"),
        (["--threads", "0"], "--threads must be a positive integer (got 0)"),
        (["--threads", "100000"], "--threads must be from 1 to 1024 (got 100000)"),
        (
            ["--optimizer", "NoSuch"],
            "--optimizer 'NoSuch' is not a torch.optim optimizer; name one such as SGD, Adam or AdamW",
        ),
        (["--optimizer", "Optimizer"], "--optimizer 'Optimizer' is not a torch.optim optimizer"),
        (["--optimizer", "lr_scheduler"], "--optimizer 'lr_scheduler' is not a torch.optim optimizer"),
        (
            ["--optimizer", "SGD", "--optimizer-arg", "betas=0.9"],
            "--optimizer-arg betas: SGD takes no argument 'betas'; it takes momentum, dampening",
        ),
        (["--optimizer-arg", "lr=0.1"], "--optimizer-arg lr: give the learning rate with --lr"),
        (
            ["--optimizer-arg", "betas=0.9"],
            "--optimizer-arg betas: Adam's betas is a tuple (default (0.9, 0.999)), which --optimizer-arg "
            "(one number) cannot give; leave it at its default",
        ),
        (
            ["--optimizer", "LBFGS"],
            "--optimizer LBFGS: its step needs a closure that evaluates the loss again, which a pipeline step "
            "cannot give; use SGD, Adam or AdamW",
        ),
        (["--optimizer", "SparseAdam"], "--optimizer SparseAdam: it takes only sparse gradients"),
        (
            ["--optimizer-arg", "capturable=1", "--device", "cpu"],
            "--optimizer Adam refuses --lr 0.001 capturable=1: If capturable=True, params and state_steps must "
            "be on supported devices",
        ),
        (["--optimizer-arg", "eps=1e400"], "--optimizer-arg eps=inf: the value must be a finite number"),
        (
            ["--optimizer", "SGD", "--optimizer-arg", "momentum=-1"],
            "--optimizer SGD refuses --lr 0.001 momentum=-1: Invalid momentum value: -1.0; fix the values",
        ),
        (
            ["--optimizer", "SGD", "--optimizer-arg", "nesterov=1"],
            "--optimizer SGD refuses --lr 0.001 nesterov=1: Nesterov momentum requires a momentum",
        ),
        (
            ["--resume", str(tmp / "nonexistent")],
            f"--resume {str(tmp / 'nonexistent')!r}: no such folder; give a folder written by --save-checkpoint",
        ),
        (
            ["--resume", str(tmp / "empty")],
            f"--resume: no checkpoint in {tmp / 'empty'} (no meta.json); write one with --save-checkpoint",
        ),
        (
            ["--resume", str(tmp / "bad-meta")],
            f"--resume: {tmp / 'bad-meta' / 'meta.json'} is not valid JSON (Expecting property name",
        ),
        (
            ["--resume", str(tmp / "ck"), "--seed", str(2**64 - 12)],
            f"--seed {2**64 - 12} with --steps 10 after the checkpoint's 4 steps seeds torch beyond",
        ),
        (
            ["--save-checkpoint", str(tmp / "a-file")],
            f"--save-checkpoint {str(tmp / 'a-file')!r} is a file; give a folder (made if missing)",
        ),
        (
            ["--save-checkpoint", str(tmp / "a-file" / "ck")],
            f"--save-checkpoint {str(tmp / 'a-file' / 'ck')!r}: {str(tmp / 'a-file')!r} is a file, "
            "so no folder can be made under it",
        ),
        (
            ["--save-checkpoint", "/proc/autopipe-ck"],
            "--save-checkpoint '/proc/autopipe-ck': cannot write in '/proc' (",
        ),
        (
            ["--engine", "torch", "--save-checkpoint", str(tmp / "ck2")],
            "--save-checkpoint and --resume work with --engine autopipe only",
        ),
        (
            ["--engine", "torch", "--resume", str(tmp / "ck")],
            "--save-checkpoint and --resume work with --engine autopipe only",
        ),
    ]


def test_every_bad_run_flag_is_one_true_line_before_any_rank_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, message in _flag_cases(tmp_path):
        if argv[-1].startswith("/proc") and not sys.platform.startswith("linux"):
            continue
        with pytest.raises(RunOptionError) as info:
            run_options(rank_parser().parse_args(["plan.json", "--device", "cpu", *argv]))
        assert message in str(info.value), argv
        assert "\n" not in str(info.value) and len(str(info.value)) < 300
        # autopipe run: exit 2 and that line, before reading the plan (there is none here)
        assert main(["run", "plan.json", "--device", "cpu", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, argv


def test_good_flags_pass_the_checks(tmp_path: Path) -> None:
    ck = _checkpoint(tmp_path / "ck", optimizer="SGD")
    argv = [
        "plan.json",
        "--device",
        "cpu",
        "--optimizer",
        "SGD",
        "--optimizer-arg",
        "momentum=0.9",
        "--optimizer-arg",
        "nesterov=1",
        "--resume",
        str(ck),
        "--save-checkpoint",
        str(tmp_path / "new" / "ck"),
        "--seed",
        str(2**64 - 15),
        "--steps",
        "10",
        "--timeout",
        "500ms",
        "--lr",
        "0",
    ]
    options = run_options(rank_parser().parse_args(argv))
    assert (options.seed, options.timeout_s, options.lr) == (2**64 - 15, 0.5, 0.0)
    assert not (tmp_path / "new").exists()  # checking the folder leaves nothing behind
    assert list(tmp_path.iterdir()) == [ck]


def test_cuda_without_cuda_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    message = "--device cuda: CUDA is not available on this machine (torch "
    with pytest.raises(RunOptionError, match=r"--device cuda: CUDA is not available .*; use --device cpu$"):
        run_options(rank_parser().parse_args(["plan.json", "--device", "cuda"]))
    assert main(["run", "plan.json", "--device", "cuda"]) == 2
    assert message in capsys.readouterr().err


def test_engine_torch_takes_a_schedule_torch_has_no_class_for() -> None:
    from tests.runtime.helpers import cached_plan  # the plan test_engine.py trains with v-min

    # torch runs it from the plan's schedule CSV (autopipe/stages/schedule_csv.py): nothing to refuse
    check_launch(RunOptions(engine=Engine.TORCH), cached_plan("skip", 2, "v-min", 2, (0, 3)))


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        ("recompute_modules", ("core_attn",), "--recompute-modules none"),
        ("recompute_layers", 2, "--recompute-layers 0"),
        ("offload_modules", ("qkv_linear",), "--offload-modules none"),
    ],
)
def test_a_plan_with_a_memory_choice_is_refused_before_any_rank_starts(field: str, value: object, flag: str) -> None:
    """autopipe's executor recomputes whole stages; Megatron-LM's uniform choices are Megatron's to run."""
    from autopipe.plans import Plan
    from autopipe.runtime.pipeline import executor_refusal
    from tests.helpers import FIXTURES

    plan = dataclasses.replace(Plan.load(FIXTURES / "good_mlp_plan_v1.json"), **{field: value})  # type: ignore[arg-type]
    assert executor_refusal(dataclasses.replace(plan, **{field: type(value)()})) is None  # type: ignore[arg-type]
    with pytest.raises(RunOptionError) as got:
        check_launch(RunOptions(), plan)
    said = str(got.value)
    assert "\n" not in said and f"plan again with {flag} to run it here" in said and "--for megatron" in said
