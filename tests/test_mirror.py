"""Tests mirror modules: a reader finds a module's tests by its name.

``autopipe/<package>/<module>.py`` has ``tests/<package>/test_<module>.py`` (``cli/<module>.py``
``tests/cli/test_<module>.py``; a top-level ``autopipe/<module>.py`` ``tests/test_<module>.py``;
a private ``_module.py`` ``test_module.py``), or its docstring names the grouped test file that
tests it, on a line of its own: ``Tests: tests/partition/test_solvers.py.``
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POINTER = re.compile(r"^Tests: (tests/\S+\.py)\.?$", re.MULTILINE)


def modules() -> list[Path]:
    """The library's and the CLI's modules (package front doors and ``__main__`` shims left out)."""
    found = [*(ROOT / "autopipe").rglob("*.py"), *(ROOT / "cli").glob("*.py")]
    return sorted(p for p in found if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts)


def mirror(module: Path) -> Path:
    """The test file named for ``module``."""
    rel = module.relative_to(ROOT)
    folder = rel.parent.parts[1:] if rel.parts[0] == "autopipe" else rel.parent.parts
    return ROOT.joinpath("tests", *folder, f"test_{module.stem.lstrip('_')}.py")


def pointers(module: Path) -> list[str]:
    """The test files ``module``'s docstring names on a ``Tests:`` line."""
    doc = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8"))) or ""
    return POINTER.findall(doc)


def test_every_module_has_a_test_file_named_for_it_or_names_its_own() -> None:
    unmirrored = []
    for module in modules():
        named = pointers(module)
        if mirror(module).is_file() or (named and all((ROOT / n).is_file() for n in named)):
            continue
        where = f"its docstring names {', '.join(named)}, which is not there" if named else "no test file"
        unmirrored.append(
            f"{module.relative_to(ROOT)}: {where}; add {mirror(module).relative_to(ROOT)} "
            "or a 'Tests: tests/...py.' line"
        )
    assert not unmirrored, "\n".join(unmirrored)


def test_the_rule_reads_as_the_layout_does() -> None:
    assert mirror(ROOT / "autopipe" / "partition" / "chain.py") == ROOT / "tests" / "partition" / "test_chain.py"
    assert (
        mirror(ROOT / "autopipe" / "partition" / "_intervals.py") == ROOT / "tests" / "partition" / "test_intervals.py"
    )
    assert mirror(ROOT / "autopipe" / "api.py") == ROOT / "tests" / "test_api.py"
    assert mirror(ROOT / "cli" / "plan_cmd.py") == ROOT / "tests" / "cli" / "test_plan_cmd.py"
    assert pointers(ROOT / "autopipe" / "partition" / "brute.py") == ["tests/partition/test_solvers.py"]
    assert len(modules()) > 50
