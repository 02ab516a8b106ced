"""The code is linted and formatted (ruff, over the files git tracks: a file the README's own
commands write into the checkout is not the project's), ``# fmt: skip`` / ``# fmt: off`` carry
their reason, and it is strictly typed (mypy --strict, configured in pyproject.toml)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A "fmt: skip" pragma carries a "# reason: ..." comment after it on its line (ruff honours a
# skip followed by another comment, but not by other text: "(why)" would switch the skip off);
# ruff ignores a "fmt: off" with anything after it, so an off has its reason on the line above.
_PRAGMA = re.compile(r"^#\s*fmt:\s*(skip|off)\b(.*)$|#\s*fmt:\s*(skip)\b(.*)$")
_REASON = re.compile(r"#\s*reason:\s*\S")


def _tool(name: str) -> list[str]:
    if shutil.which(name) is None and not (Path(sys.executable).parent / name).exists():
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return [str(Path(sys.executable).parent / name) if (Path(sys.executable).parent / name).exists() else name]


def _tracked() -> list[str]:
    """The Python files git tracks (stubs included), relative to the repository root."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the lint tests check the files git tracks")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py", "*.pyi"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return sorted(name for name in out.split("\0") if name and (ROOT / name).exists())


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    # --force-exclude: pyproject's extend-exclude holds for files named on the command line too
    command = [*_tool("ruff"), *args, "--force-exclude", *_tracked()]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff() -> None:
    result = _ruff("check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = _ruff("format", "--check")
    assert result.returncode == 0, "run `ruff format` on these files:\n" + result.stdout + result.stderr


def _unexplained_pragmas(path: str, text: str) -> list[str]:
    """``path:line`` of each ``# fmt: skip`` / ``# fmt: off`` comment without its reason."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return []  # not Python (a fixture that is a syntax error on purpose): ruff skips it too
    comments = {tok.start[0]: tok.string for tok in tokens if tok.type == tokenize.COMMENT}
    lines = text.splitlines()
    out = []
    for n, comment in sorted(comments.items()):
        found = _PRAGMA.search(comment)
        if not found:
            continue
        if found.group(1) == "off":
            explained = _REASON.match(comments.get(n - 1, "")) is not None
        else:
            explained = _REASON.search(found.group(2) if found.group(1) else found.group(4)) is not None
        if not explained:
            out.append(f"{path}:{n}: {lines[n - 1].strip()}")
    return out


def test_fmt_skip_and_off_carry_their_reason() -> None:
    found = [hit for name in _tracked() for hit in _unexplained_pragmas(name, (ROOT / name).read_text())]
    assert not found, (
        "write why the formatter is kept off: `# fmt: skip  # reason: ...` on the same line, "
        "`# reason: ...` on the line above a `# fmt: off` (docs/contributing.md):\n" + "\n".join(found)
    )


def test_the_pragma_check_wants_a_reason() -> None:
    text = (
        "a = (1,)  # fmt: skip\n"
        "b = (1,)  # fmt: skip  # reason: columns\n"
        "# reason: a table\n"
        "# fmt: off\n"
        "c = 1\n"
        "# fmt: on\n"
        "# fmt: off\n"
        "d = 1  # fmt: skip (columns)\n"
        "e = '# fmt: skip'  # a string is not a pragma\n"
        "f = 1  # noqa: E501  # fmt: skip  # reason: a long literal\n"
    )
    assert _unexplained_pragmas("x.py", text) == [
        "x.py:1: a = (1,)  # fmt: skip",
        "x.py:7: # fmt: off",
        "x.py:8: d = 1  # fmt: skip (columns)",
    ]


@pytest.mark.slow
@pytest.mark.timeout(960)  # hang-only: a fresh clone (no .mypy_cache) on a busy 2-core machine takes minutes
def test_mypy_strict() -> None:
    result = subprocess.run(_tool("mypy"), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
