"""docs/: the CLI reference is the parser's own (regenerated, never edited), every page is linked
from the README, and every link between the pages (and its #anchor) resolves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from autopipe.cli.reference import REGENERATE, render

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Written on another branch of the same redesign; linked before it lands, checked once it has.
PENDING = {"docs/contributing.md"}
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_cli_reference_is_in_sync_with_the_parser() -> None:
    written = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert written == render(), f"docs/cli.md is out of date with cli/: regenerate it with '{REGENERATE}'"


def test_the_cli_reference_lists_every_command_and_flag() -> None:
    text = render()
    for command in ("profile", "plan", "show", "emit", "merge", "run", "calibrate", "config"):
        assert f"## `autopipe {command}`" in text
    assert "`--schedule {gpipe," in text and "`--memory MEMORY`" in text and "`--steps N`" in text


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if f"(docs/{p.name})" not in readme]
    assert not unlinked, f"README.md links no docs page {unlinked}: add a line for each to its Documentation list"


def test_every_link_and_anchor_between_the_pages_resolves() -> None:
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target, anchor in LINK.findall(text):
            if target.startswith("http") or not (target.endswith(".md") or (not target and anchor)):
                continue
            path = (page.parent / target).resolve() if target else page
            if str(path.relative_to(ROOT)) in PENDING and not path.exists():
                continue
            where = f"{page.relative_to(ROOT)} links {target}#{anchor}"
            assert path.is_file(), f"{where}, which does not exist"
            assert not anchor or anchor in _anchors(path), f"{where}: {path.name} has no heading with that anchor"


def test_every_python_block_in_the_docs_parses() -> None:
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"```python\n(.*?)```", text, re.S):
            line = text[: m.start()].count("\n") + 1
            try:
                ast.parse(m.group(1))
            except SyntaxError as e:
                raise AssertionError(
                    f"docs/{page.name}:{line + (e.lineno or 0)}: the ```python block does not parse: {e.msg}"
                ) from None


def test_every_repository_path_the_pages_name_exists() -> None:
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        named = set(re.findall(r"`((?:autopipe|cli|tests|bench|models)/[\w/.-]+)`", page.read_text(encoding="utf-8")))
        missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
        assert not missing, f"{page.relative_to(ROOT)} names {missing}, which do not exist: update the page"
