"""The README's Python blocks are valid Python: scripts as they are, signatures as stubs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_python_block_in_the_readme_parses() -> None:
    text = README.read_text(encoding="utf-8")
    blocks = [(text[: m.start()].count("\n") + 1, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]
    assert len(blocks) >= 5  # the model-file convention and the scripts
    for line, code in blocks:
        try:
            ast.parse(code)
        except SyntaxError as e:
            raise AssertionError(f"README.md:{line + (e.lineno or 0)}: the ```python block does not parse: {e.msg}") from None
    convention = next(code for _, code in blocks if "def build_model" in code)
    stubs = [n.name for n in ast.parse(convention).body if isinstance(n, ast.FunctionDef)]
    assert stubs == ["build_model", "example_inputs", "example_targets", "loss_fn", "train_data"]
