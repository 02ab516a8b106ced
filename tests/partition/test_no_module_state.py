"""The pure kernels and the planner keep nothing at module level: no ``functools`` caches, no
memo objects or mutable containers assigned at the top of a module (what a search reuses is
made by the search: ``planner.context``; what a kernel keeps, in the memo it is given)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import autopipe

ROOT = Path(autopipe.__file__).parent
MODULES = sorted([*(ROOT / "partition").glob("*.py"), *(ROOT / "planner").glob("*.py")])
MUTABLE_CALLS = {"Recent", "BlockMemo", "Memo", "Schedules", "dict", "list", "set", "defaultdict", "OrderedDict"}


def _module_state(tree: ast.Module) -> list[str]:
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for dec in node.decorator_list:
                name = ast.unparse(dec)
                if "cache" in name:
                    found.append(f"line {node.lineno}: @{name} on {node.name}")
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            continue  # the public names
        if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
            found.append(f"line {node.lineno}: a mutable {type(value).__name__}")
        if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in MUTABLE_CALLS:
            found.append(f"line {node.lineno}: {ast.unparse(value)}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_module_level_cache_or_memo(path: Path) -> None:
    assert _module_state(ast.parse(path.read_text())) == []


def test_the_check_finds_a_module_cache() -> None:
    tree = ast.parse(
        "import functools\n@functools.lru_cache(maxsize=8)\ndef f(x): return x\n_SEEN = {}\n_R = Recent(8)\n"
    )
    assert len(_module_state(tree)) == 3
