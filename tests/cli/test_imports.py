"""The command line calls :mod:`autopipe.api` and prints: it imports none of the steps behind it
(``TYPE_CHECKING`` imports included), and ``autopipe --help`` waits for no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = (
    "autopipe.partition",
    "autopipe.planner",
    "autopipe.simulate",
    "autopipe.costs",
    "autopipe.graph",
    "autopipe.model",
)


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_cli_imports_no_step_behind_the_api() -> None:
    wrong = {
        f"{path.name}: {name}"
        for path in sorted((ROOT / "cli").glob("*.py"))
        for name in _imported(path)
        if any(name == step or name.startswith(step + ".") for step in STEPS)
    }
    assert not wrong, sorted(wrong)


def test_import_autopipe_and_help_wait_for_no_torch() -> None:
    code = (
        "import sys, contextlib, io\n"
        "import autopipe\n"
        "assert 'torch' not in sys.modules, 'import autopipe'\n"
        "from autopipe.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--help']) == 0 and main(['plan', '--help']) == 0\n"
        "assert 'torch' not in sys.modules, 'autopipe --help'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
