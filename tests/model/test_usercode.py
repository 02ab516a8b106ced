"""The guard around user code: whatever a model file does, one line (exit 2), or exit 130 for Ctrl-C.

Each cause is fed through the library (``load_model`` + ``check_model_runs``, the calls every
command makes first) and through a command (``autopipe profile``, in this process), and the line
is asserted: a ``BaseException`` of the user's, an exception whose ``__str__`` fails,
``sys.exit`` and ``KeyboardInterrupt`` raised by the code, each from the import, the factory,
``example_inputs`` and the forward (the check run, tracing, profiling); a call that runs past the
model-file time limit (``--load-timeout``); a model file that is a FIFO or a device.
"""

from __future__ import annotations

import io
import os
import signal
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import torch
from autopipe.cli.main import main

from autopipe.errors import InputError, ModelLoadError
from autopipe.model.load import check_model_runs, load_model
from autopipe.model.usercode import DEFAULT_LOAD_TIMEOUT_S, guarded, load_timeout
from tests.helpers import FIXTURES

torch.set_num_threads(1)

GOOD = (FIXTURES / "good_mlp.py").read_text()
HEAD = "import os, signal, sys, time\nimport torch.fx\n\nclass Boom(BaseException):\n    pass\n\n"
LIMIT_S = 0.5

# cause -> (code appended to good_mlp.py, which redefines what it breaks; what the line says)
CAUSES: dict[str, tuple[str, str]] = {
    "base exception in build_model": (
        "def build_model(**kw):\n    raise Boom('kaboom')\n",
        "build_model raised Boom: kaboom ({path}:",
    ),
    "base exception at import": ("raise Boom('at import')\n", "importing {path} raised Boom: at import ({path}:"),
    "bad __str__": (
        "class Ugly(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n\n"
        "def build_model(**kw):\n    raise Ugly()\n",
        "build_model raised Ugly: <its message cannot be shown: str() raised RuntimeError> ({path}:",
    ),
    "__str__ not a str": (
        "class Odd(Exception):\n    def __str__(self):\n        return 5\n\ndef build_model(**kw):\n    raise Odd()\n",
        "build_model raised Odd: <its message cannot be shown: str() raised TypeError>",
    ),
    "bad __repr__ in sys.exit": (
        "class R:\n    def __repr__(self):\n        raise ValueError\n\ndef build_model(**kw):\n    sys.exit(R())\n",
        "called sys.exit(<a R whose repr() raised ValueError>)",
    ),
    "sys.exit in build_model": (
        "def build_model(**kw):\n    sys.exit(3)\n",
        "build_model in {path} called sys.exit(3) ({path}:",
    ),
    "sys.exit at import": ("sys.exit(4)\n", "{path} called sys.exit(4) ({path}:"),
    "sys.exit in example_inputs": (
        "def example_inputs(batch_size, width=16):\n    sys.exit(5)\n",
        "example_inputs(2) in {path} called sys.exit(5)",
    ),
    "KeyboardInterrupt raised by build_model": (
        "def build_model(**kw):\n    raise KeyboardInterrupt\n",
        "build_model raised KeyboardInterrupt ({path}:",
    ),
    "base exception in forward": (
        "def _fwd(self, x):\n    raise Boom('in forward')\nMLP.forward = _fwd\n",
        "the model rejected its example inputs (input shapes: (2, 16) float32): Boom: in forward ({path}:",
    ),
    "sys.exit in forward": (
        "def _fwd(self, x):\n    sys.exit(6)\nMLP.forward = _fwd\n",
        "the model's forward called sys.exit(6)",
    ),
    "build_model loops": (
        "def build_model(**kw):\n    while True:\n        pass\n",
        "build_model in {path} did not finish within",
    ),
    "example_inputs sleeps": (
        "def example_inputs(batch_size, width=16):\n    time.sleep(60)\n",
        "example_inputs(2) in {path} did not finish within 0.5 s, the time limit for model-file calls; "
        "if it is only slow, raise the limit (--load-timeout SECONDS",
    ),
    "import loops": ("while True:\n    pass\n", "importing {path} did not finish within 0.5 s"),
}


def write_model(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "m.py"
    path.write_text(GOOD + "\n" + HEAD + textwrap.dedent(extra))
    return path


def load_error(path: Path) -> str:
    with load_timeout(LIMIT_S), pytest.raises(ModelLoadError) as info:
        check_model_runs(load_model(str(path)), 2)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def profile_argv(path: Path, tmp_path: Path, *more: str) -> list[str]:
    flags = "--batch-size 2 --micro-batch-sizes 2 --warmup 0 --repeat 1 --device cpu".split()
    return ["profile", str(path), *flags, "-o", str(tmp_path / "profile.json"), *more]


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_user_code_fault_is_one_line_from_the_library(tmp_path: Path, cause: str) -> None:
    extra, said = CAUSES[cause]
    path = write_model(tmp_path, extra)
    assert said.format(path=path) in load_error(path)


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_user_code_fault_is_one_line_and_exit_2_from_the_cli(tmp_path: Path, cause: str) -> None:
    extra, said = CAUSES[cause]
    path = write_model(tmp_path, extra)
    code, _out, err = cli(profile_argv(path, tmp_path, "--load-timeout", str(LIMIT_S)))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("autopipe: error: "), err
    assert said.format(path=path) in err
    assert not (tmp_path / "profile.json").exists()


@pytest.mark.parametrize(
    ("phase", "condition"),
    [("tracing", "torch.fx._symbolic_trace.is_fx_tracing()"), ("profiling", "torch.is_grad_enabled()")],
)
def test_exit_in_forward_while_tracing_or_profiling_is_one_line(tmp_path: Path, phase: str, condition: str) -> None:
    extra = (
        f"_plain = MLP.forward\ndef _fwd(self, x):\n    if {condition}:\n        sys.exit(7)\n"
        "    return _plain(self, x)\n"
    )
    path = write_model(tmp_path, extra + "MLP.forward = _fwd\n")
    code, _out, err = cli(profile_argv(path, tmp_path))
    assert code == 2 and err.count("\n") == 1, err
    assert "the model's forward (" in err and f"in {path} called sys.exit(7)" in err, err


def test_ctrl_c_during_user_code_is_an_interrupt(tmp_path: Path) -> None:
    """SIGINT arriving while build_model runs ends the command as the user asked: exit 130."""
    path = write_model(
        tmp_path, "def build_model(**kw):\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(30)\n"
    )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        load_model(str(path))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    code, _out, err = cli(profile_argv(path, tmp_path))
    assert (code, err) == (130, "autopipe: interrupted\n")


@pytest.mark.parametrize("disposition", [signal.SIG_IGN, signal.SIG_DFL], ids=["ignored", "default"])
def test_with_sigint_ignored_a_raised_keyboard_interrupt_is_the_codes_own(
    disposition: signal.Handlers, tmp_path: Path
) -> None:
    """A background job or nohup starts with SIGINT ignored: a Ctrl-C cannot raise there, so the
    KeyboardInterrupt build_model raises is its own fault (one line), not the user's interrupt."""
    path = write_model(tmp_path, "def build_model(**kw):\n    raise KeyboardInterrupt\n")
    previous = signal.signal(signal.SIGINT, disposition)
    try:
        message = load_error(path)
        assert signal.getsignal(signal.SIGINT) == disposition  # left as it was
    finally:
        signal.signal(signal.SIGINT, previous)
    assert message.startswith("build_model raised KeyboardInterrupt ("), message


def test_a_callers_own_sigint_handler_is_called_and_given_back(tmp_path: Path) -> None:
    """Under a program's own SIGINT handler (a notebook's, say) a Ctrl-C during user code reaches
    that handler, which stays installed after."""
    path = write_model(
        tmp_path,
        "_plain = build_model\ndef build_model(**kw):\n    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.05)\n    return _plain(**kw)\n",
    )
    got: list[int] = []

    def own(signum: int, frame: object) -> None:
        got.append(signum)

    previous = signal.signal(signal.SIGINT, own)
    try:
        load_model(str(path))
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, previous)
    assert got == [signal.SIGINT]


def test_the_time_limit_gives_back_an_outer_timer_and_handler(tmp_path: Path) -> None:
    fired: list[int] = []
    kept = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, given back at the end
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        with guarded("f", tmp_path / "m.py"):
            pass
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 29.0 < remaining <= 30.0
        assert signal.getsignal(signal.SIGALRM) is not None and not fired
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # an outer deadline before the guard's: it stands
        with pytest.raises(ModelLoadError, match="did not finish within"), guarded("f", tmp_path / "m.py"):
            signal.pause()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if kept[0]:
            signal.setitimer(signal.ITIMER_REAL, *kept)


def test_no_limit_and_the_default() -> None:
    assert DEFAULT_LOAD_TIMEOUT_S == 300.0
    before, _ = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, or none
    with load_timeout(0), guarded("f", Path("m.py")):
        assert signal.getitimer(signal.ITIMER_REAL)[0] == pytest.approx(before, abs=1.0)  # no timer of its own


@pytest.mark.parametrize(
    ("value", "said"),
    [("x", "--load-timeout must be a number of seconds, like 300 (0: no limit) (got 'x')"),
     ("-1", "--load-timeout must be from 0 (no limit) to 604800 seconds (got -1.0)"),
     ("nan", "--load-timeout must be from 0 (no limit) to 604800 seconds (got nan)"),
     ("1e9", "--load-timeout must be from 0 (no limit) to 604800 seconds (got 1000000000.0)")],
)  # fmt: skip  # reason: one case a line, its message whole
def test_bad_load_timeout_flag_is_one_line(tmp_path: Path, value: str, said: str) -> None:
    code, _out, err = cli(profile_argv(FIXTURES / "good_mlp.py", tmp_path, "--load-timeout", value))
    assert (code, err) == (2, f"autopipe: error: {said}\n")


@pytest.mark.parametrize(("value", "said"), [("5", "not a str"), (True, "not a bool"), (-2, "(got -2)")])
def test_bad_load_timeout_argument_is_an_input_error(value: object, said: str) -> None:
    with pytest.raises(InputError, match="seconds") as info, load_timeout(value):  # type: ignore[arg-type]
        pass
    assert said in str(info.value)


@pytest.mark.parametrize("kind", ["fifo", "character device"])
def test_a_model_file_that_is_not_a_regular_file_is_refused_before_reading(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "m.py"
    if kind == "fifo":
        os.mkfifo(path)
        said = f"{path} is a FIFO (named pipe), not a model file; name a regular .py file"
    else:
        path.symlink_to("/dev/zero")
        said = f"{path} is a character device, not a model file; name a regular .py file"
    assert load_error(path) == said
    code, _out, err = cli(profile_argv(path, tmp_path))
    assert (code, err) == (2, f"autopipe: error: {said}\n")


@pytest.mark.slow
def test_the_ranks_of_run_keep_the_launchers_limit(tmp_path: Path) -> None:
    """``run --load-timeout`` reaches the ranks (they load the model file again): a factory slow in
    the ranks only is stopped there, named, exit 1; no rank outlives the run."""
    import json
    import subprocess
    import sys

    from autopipe.plans import Plan
    from tests.helpers import ROOT

    path = write_model(
        tmp_path,
        "_build = build_model\ndef build_model(**kw):\n    if os.environ.get('AUTOPIPE_LAUNCHER_PID'):\n"
        "        time.sleep(60)\n    return _build(**kw)\n",
    )
    raw = json.loads(Plan.load(FIXTURES / "good_mlp_plan_v1.json").to_json())
    raw["recipe"]["model_file"] = str(path)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(raw))
    done = subprocess.run(
        [sys.executable, "-m", "autopipe.cli.main", "run", str(plan), "--steps", "1", "--load-timeout", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    assert (
        "rank 0 failed: ModelLoadError: build_model in" in done.stderr and "did not finish within 2 s" in done.stderr
    ), done.stderr


class _Stop(BaseException):
    pass


class _Exits(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise SystemExit(9)


def _stop(batch_size: int) -> torch.Tensor:
    raise _Stop("no batch")


@pytest.mark.parametrize(
    ("model", "inputs", "said"),
    [
        (torch.nn.Linear(4, 4), _stop, "example_inputs(4) raised _Stop: no batch ("),
        (_Exits(), torch.zeros(4, 4), "the model's forward called sys.exit(9) ("),
    ],
)
def test_an_in_memory_module_and_its_functions_are_guarded_too(model: Any, inputs: Any, said: str) -> None:
    import autopipe

    with pytest.raises(ModelLoadError) as info:
        autopipe.profile(model, inputs, micro_batch_sizes=(4,), warmup=0, repeat=1)
    assert said in str(info.value) and "\n" not in str(info.value)
