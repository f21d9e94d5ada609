"""MkDocs hook: the configuration and command-line references are generated from the code.

A page that holds ``<!-- reference: settings -->`` gets the table of every environment
variable (``agora_pg.settings.VARIABLES``); one that holds ``<!-- reference: cli -->``
gets every command of ``agora_pg.cli.build_parser()`` with its options and example.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from typing import Any

from agora_pg.cli import build_parser
from agora_pg.settings import VARIABLES

SETTINGS_MARK = "<!-- reference: settings -->"
CLI_MARK = "<!-- reference: cli -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if SETTINGS_MARK in markdown:
        markdown = markdown.replace(SETTINGS_MARK, settings_table())
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    return markdown


def settings_table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for variable in VARIABLES:
        names = " or ".join(f"`{name}`" for name in variable.names)
        rows.append(f"| {names} | {variable.default} | {cell(variable.meaning)} |")
    return "\n".join(rows)


def cli_reference() -> str:
    parser = build_parser()
    parser.prog = "agora-pg"
    sections = [block("agora-pg", parser, set())]
    common = {"log_level", "log_format"}  # every command takes them: listed once, above
    sections += [block(name, command, common) for name, command in commands(parser, "agora-pg")]
    return "\n\n".join(sections)


def commands(parser: argparse.ArgumentParser, prefix: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (sub)command under ``parser``, depth first, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                full = f"{prefix} {name}"
                yield full, command
                yield from commands(command, full)


def block(name: str, parser: argparse.ArgumentParser, skipped: set[str]) -> str:
    lines = [f"### `{name}`", "", cell(parser.description or ""), ""]
    usage = " ".join(parser.format_usage().removeprefix("usage: ").split())
    for dest in skipped:  # "[--log-level {DEBUG,...}]" on every command says nothing new
        usage = re.sub(r" \[--" + dest.replace("_", "-") + r" \{[^}]*\}\]", "", usage)
    lines += ["```text", usage, "```", ""]
    options = [action for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
               and action.dest not in skipped]
    if options:
        lines += ["| argument | meaning |", "|---|---|"]
        for action in options:
            flags = ", ".join(action.option_strings) or action.dest
            metavar = "" if action.nargs == 0 or not action.option_strings else f" {action.metavar or action.dest.upper()}"
            choices = f" (one of {', '.join(map(str, action.choices))})" if action.choices else ""
            meaning = parser._get_formatter()._expand_help(action) if action.help else ""
            lines.append(f"| `{flags}{metavar}` | {cell(meaning)}{choices} |")
        lines.append("")
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```"]
    return "\n".join(lines)


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")
