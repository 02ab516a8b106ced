"""The code is linted (ruff) and strictly typed (mypy --strict, configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> list[str]:
    if shutil.which(name) is None and not (Path(sys.executable).parent / name).exists():
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return [str(Path(sys.executable).parent / name) if (Path(sys.executable).parent / name).exists() else name]


def tracked_python() -> list[str]:
    """The Python files git tracks (``git add`` a new one), so what a command writes in the checkout
    (the README's ``autopipe emit plan.json -o stages/``) is not linted; ``["."]`` outside git."""
    try:
        listed = subprocess.run(["git", "ls-files", "*.py"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ["."]
    return [f for f in listed.stdout.splitlines() if (ROOT / f).is_file()] or ["."]


def test_ruff() -> None:
    result = subprocess.run([*_tool("ruff"), "check", "--force-exclude", *tracked_python()], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(960)  # hang-only: a fresh clone (no .mypy_cache) on a busy 2-core machine takes minutes
def test_mypy_strict() -> None:
    result = subprocess.run(_tool("mypy"), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
