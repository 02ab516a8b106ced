"""Progress on stderr (a bar only on a terminal, none under --json) and quiet, honest notes."""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from autopipe.cli import plan_cmd
from autopipe.cli.main import build_parser, main
from autopipe.cli.progress import ProgressCallback, library_notes, progress_bar
from rich.console import Console
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[2]
LLAMA, MOE = str(ROOT / "models" / "llama.py"), str(ROOT / "tests" / "fixtures" / "grouped_moe.py")


@pytest.fixture(autouse=True)
def _one_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    monkeypatch.delenv("AUTOPIPE_DEVICES", raising=False)


class _Counted(io.StringIO):
    """A terminal's stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


class _FirstOp(TorchDispatchMode):
    """Remembers how many writes ``stream`` had had when the first torch operator ran."""

    def __init__(self, stream: _Counted) -> None:
        super().__init__()
        self.stream = stream
        self.writes_before: int | None = None

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if self.writes_before is None:
            self.writes_before = self.stream.writes
        return func(*args, **(kwargs or {}))


def _terminal() -> tuple[Console, _Counted]:
    stream = _Counted()
    return Console(file=stream, force_terminal=True, width=120), stream


def test_a_bar_only_on_a_terminal_and_never_under_json() -> None:
    with progress_bar(Console(file=io.StringIO())) as report:
        assert report is None  # redirected stderr stays clean
    console, stream = _terminal()
    with progress_bar(console, quiet=True) as report:
        assert report is None  # --json
    with progress_bar(console) as report:
        assert report is not None
        report("loading", 0, 0)  # total unknown: a pulsing bar
        report("counting", 3, 7)
    assert "counting" in stream.getvalue() and "3/7" in stream.getvalue()


def test_library_warnings_are_one_autopipe_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    log = logging.getLogger("autopipe")
    with library_notes():
        log.warning("op %s fell back", "x")
        log.warning("op %s fell back", "x")  # told once
        log.info("not a warning")
    assert capsys.readouterr().err == "autopipe: op x fell back\n"
    assert not log.handlers  # restored


def _plan(argv: list[str], err: Console) -> None:
    """Run ``autopipe plan`` with ``err`` as its stderr."""
    args = build_parser().parse_args(["plan", *argv])
    assert args.func(args, Console(file=io.StringIO()), err) == 0


@pytest.mark.slow
def test_analytic_planning_shows_progress_at_once_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [LLAMA, "-k", "n_layer=8", "--device", "h100", "--gpus", "8", "-o", str(tmp_path / "p.json")]
    console, stream = _terminal()
    with _FirstOp(stream) as first:
        _plan(argv, console)
    # shown at once: drawn before the first torch operator runs (building the model on meta)
    assert first.writes_before, first.writes_before
    # Every step tells the bar (it draws 8 times a second, so quick steps may not be seen).
    calls: list[tuple[str, int, int]] = []

    @contextlib.contextmanager
    def recorder(console: Console, quiet: bool = False) -> Iterator[ProgressCallback]:
        yield lambda what, done, total: calls.append((what, done, total))

    monkeypatch.setattr(plan_cmd, "progress_bar", recorder)
    _plan(argv, Console(file=io.StringIO()))
    whats = [w for w, _, _ in calls]
    steps = (
        "loading",
        "tracing at micro-batch size 2",
        "counting at micro-batch size 2",
        "t=",
    )  # then each t x S x D searched
    firsts = [next(i for i, w in enumerate(whats) if w.startswith(step)) for step in steps]
    assert re.fullmatch(r"t=\d+ x S=\d+ x D=\d+: searching", whats[firsts[-1]])
    assert firsts == sorted(firsts)
    # Block by block: the 8 identical layers are counted as a copy with 3 (costs/deepen.py), so
    # 3 layers, the embedding, the norm and the head; every step of the count is told.
    assert [(d, t) for w, d, t in calls if w == "counting at micro-batch size 4"][-6:] == [(k, 6) for k in range(1, 7)]
    monkeypatch.undo()
    # Not a terminal, or --json on one: nothing at all on stderr.
    quiet = io.StringIO()
    _plan(argv, Console(file=quiet))
    console, stream = _terminal()
    _plan([*argv, "--json"], console)
    assert quiet.getvalue() == "" and stream.getvalue() == ""


@pytest.mark.slow
def test_a_failing_meta_kernel_is_one_line_not_torch_tracebacks(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # grouped_moe's experts call torch._grouped_mm, whose meta kernel refuses fp32 ("Expected
    # inputs of BF16 type"): torch logs a traceback each time (66 lines for one profile) before
    # the real run or the model's own fallback takes over.
    grouped = "torch's meta kernel for aten._grouped_mm.default failed (Expected inputs of BF16 type but got"
    out = str(tmp_path / "out.json")
    assert (
        main(["profile", MOE, "--batch-size", "4", "--device", "cpu", "--warmup", "0", "--repeat", "1", "-o", out]) == 0
    )
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"autopipe: {grouped}"), err
    assert err[0].endswith("; shapes were taken from a real run, and times are measured")
    assert (
        main(["plan", MOE, "--batch-size", "4", "--device", "h100", "--dtype", "fp32", "--stages", "2", "-o", out]) == 0
    )
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"autopipe: {grouped}"), err
    assert err[0].endswith("; the model's own fallback for it was traced and priced")
    assert main(["plan", MOE, "--batch-size", "4", "--device", "h100", "--stages", "2", "-o", out]) == 0
    assert capfd.readouterr().err == ""  # bf16 on meta: the kernel works, nothing to say
    fake = logging.getLogger("torch._subclasses.fake_tensor")
    assert not fake.filters and fake.level == logging.NOTSET  # torch's loggers as they were
