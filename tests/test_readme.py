"""The README's blocks: its Python blocks parse (scripts as they are, signatures as stubs), and its
bash blocks run, in order, in a temporary folder holding a copy of ``models/`` and the README's
own ``my_model.py``.

A bash block preceded by an HTML comment ``<!-- not run: REASON -->`` is skipped (the install,
the test suite itself); every other block must succeed. Each block writes its own file names, so
running them leaves nothing in the repository.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOT_RUN = re.compile(r"<!--\s*not run:[^>]*-->\s*$")


def _blocks(language: str) -> list[tuple[int, str, bool]]:
    """(line, code, marked not run) of every ```language block of the README."""
    text = README.read_text(encoding="utf-8")
    found = []
    for m in re.finditer(rf"```{language}\n(.*?)```", text, re.S):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append((text[: m.start()].count("\n") + 1, m.group(1), bool(NOT_RUN.search(before))))
    return found


def test_every_python_block_in_the_readme_parses() -> None:
    blocks = [(line, code) for line, code, _ in _blocks("python")]
    assert len(blocks) >= 4  # the model-file convention and the scripts (chaining emitted stages: docs/outlets.md)
    for line, code in blocks:
        try:
            ast.parse(code)
        except SyntaxError as e:
            raise AssertionError(
                f"README.md:{line + (e.lineno or 0)}: the ```python block does not parse: {e.msg}"
            ) from None
    convention = next(code for _, code in blocks if "def build_model" in code)
    stubs = [n.name for n in ast.parse(convention).body if isinstance(n, ast.FunctionDef)]
    assert stubs == ["build_model", "example_inputs", "example_targets", "loss_fn", "train_data"]


def test_the_readme_model_file_is_complete() -> None:
    own = next(code for _, code, _ in _blocks("python") if code.startswith("# my_model.py"))
    stubs = [n.name for n in ast.parse(own).body if isinstance(n, ast.FunctionDef)]
    assert stubs == ["build_model", "example_inputs", "example_targets", "loss_fn", "train_data"]


@pytest.mark.slow
def test_every_bash_block_in_the_readme_runs(tmp_path: Path) -> None:
    blocks = _blocks("bash")
    skipped = [line for line, _, not_run in blocks if not_run]
    assert len(skipped) == 2, (
        f"README.md lines {skipped}: expected only the install and the test suite marked 'not run'"
    )
    shutil.copytree(ROOT / "models", tmp_path / "models", ignore=shutil.ignore_patterns("__pycache__"))
    own = next(code for _, code, _ in _blocks("python") if code.startswith("# my_model.py"))
    (tmp_path / "my_model.py").write_text(own, encoding="utf-8")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("COLUMNS", None)
    for line, code, not_run in blocks:
        if not_run:
            continue
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (
            f"README.md:{line}: the ```bash block failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    assert (tmp_path / "gpt-plan.json").is_file() and (tmp_path / "my-plan.json").is_file()
    assert (tmp_path / "gpt-stages" / "manifest.json").is_file()
    assert not any((ROOT / name).exists() for name in ("gpt-plan.json", "my-plan.json", "gpt-stages"))
