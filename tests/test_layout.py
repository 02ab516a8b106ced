"""The package's shape: folders in flow order, small modules, no import circles.

Imports are read from the source (``ast``), function-level ones included, so a circle hidden
inside a function body counts as one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "autopipe"
CLI = ROOT / "cli"
MAX_LINES = 400  # the "about 400": a module past it is two ideas
MAX_TOP_LEVEL = 8  # modules directly in autopipe/, __init__ included


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for the library and the CLI (installed as autopipe.cli)."""
    found: dict[str, Path] = {}
    for base, prefix in ((LIBRARY, "autopipe"), (CLI, "autopipe.cli")):
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The autopipe modules ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    # Importing a.b.c runs a/__init__ and a/b/__init__ first; a package's own __init__ importing
    # its submodules is how packages work, not a circle, so parents are not edges here.
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue  # a package and its own submodules
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circles_function_level_imports_included() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_circle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_is_over_about_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_few_modules_directly_in_the_library() -> None:
    top = sorted(p.name for p in LIBRARY.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_submodule_shadows_a_top_level_api_function() -> None:
    import autopipe

    for name in ("plan", "profile"):
        assert not (LIBRARY / f"{name}.py").exists() and not (LIBRARY / name).is_dir()
        assert callable(getattr(autopipe, name))


def test_pyproject_lists_every_package_and_the_cli_mapping() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"autopipe"} | {
        ".".join(("autopipe", *p.parent.relative_to(LIBRARY).parts)) for p in LIBRARY.rglob("*/__init__.py")
    }
    assert set(config["packages"]) == folders | {"autopipe.cli"}
    assert config["package-dir"] == {"autopipe.cli": "cli"}


def test_the_cli_imports_its_own_modules_relatively() -> None:
    # mypy checks cli/ as the package ``cli`` (the install's mapping is invisible to it), so
    # an absolute ``autopipe.cli.x`` import inside it would not resolve there.
    for path in CLI.glob("*.py"):
        assert not re.search(r"^\s*(from|import) autopipe\.cli\b", path.read_text(), re.M), path
