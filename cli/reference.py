"""The CLI reference page, rendered from the real parser (:func:`autopipe.cli.main.build_parser`).

Regenerate ``docs/cli.md`` after changing any flag (``tests/test_docs.py`` fails until you do)::

    python -m autopipe.cli.reference > docs/cli.md

Tests: tests/test_docs.py.
"""

from __future__ import annotations

import argparse
import sys

from .main import build_parser

__all__ = ["REGENERATE", "render"]

REGENERATE = "python -m autopipe.cli.reference > docs/cli.md"
_WIDTH = 100  # usage lines are wrapped here, whatever the terminal


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of every sub-command, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else None
    metavar = action.metavar or choices or action.dest.upper()
    value = " ".join(metavar) if isinstance(metavar, tuple) else metavar
    return ", ".join(f"`{o} {value}`" if action.nargs != 0 else f"`{o}`" for o in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    return f"`{action.default}`"


def _command(name: str, summary: str, sub: argparse.ArgumentParser) -> list[str]:
    usage = argparse.HelpFormatter(prog=sub.prog, width=_WIDTH)
    usage.add_usage(sub.usage, sub._actions, sub._mutually_exclusive_groups, prefix="")
    lines = [f"## `autopipe {name}`", "", f"{summary[:1].upper()}{summary[1:]}.", ""]
    lines += ["```", usage.format_help().strip(), "```", ""]
    if sub.description:
        lines += [_cell(sub.description), ""]
    lines += ["| argument | default | what it does |", "|---|---|---|"]
    expander = argparse.HelpFormatter(prog=sub.prog, width=_WIDTH)
    for action in sub._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        text = expander._expand_help(action) if action.help else ""
        lines.append(f"| {_flags(action)} | {_cell(_default(action))} | {_cell(text)} |")
    return [*lines, ""]


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """docs/cli.md: every ``autopipe`` sub-command's usage and flags, from ``parser``."""
    parser = parser or build_parser()
    out = [
        "# Which flags does each `autopipe` command take?",
        "",
        f"Generated from the parser (`cli/main.py`); do not edit by hand. Regenerate: `{REGENERATE}`.",
        "Bad input exits 2 with one `autopipe: error:` line; a failed `autopipe run` exits 1.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    commands = _subcommands(parser)
    out += [f"| [`{name}`](#autopipe-{name}) | {_cell(summary)} |" for name, summary, _ in commands]
    out.append("")
    for name, summary, sub in commands:
        out += _command(name, summary, sub)
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
