"""Every command of the CLI explains each of its options and ends its --help with an example
that parses."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator

import pytest

from agora_pg.cli import build_parser


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


COMMANDS = list(_commands(build_parser()))


def test_every_command_is_reached() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"migrate", "worker", "api", "dev", "prune", "jobs submit", "jobs list", "jobs cancel", "schedules pause",
            "runs list", "dlq replay", "run"} <= names


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(path) or "agora-pg" for path, _ in COMMANDS])
def test_every_option_has_help_and_the_command_an_example_that_parses(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
            continue
        assert action.help and action.help != argparse.SUPPRESS, f"{' '.join(path)}: {action.dest} has no help"
    epilog = parser.epilog or ""
    assert epilog.startswith("example:\n  "), f"{' '.join(path)} --help shows no example"
    example = epilog.split("\n")[1].strip()
    words = shlex.split(example.split("&&")[0])
    words = [word for word in words if "=" not in word or word.startswith("-")]  # drop VAR=value prefixes
    assert words[0] == "agora-pg" and tuple(words[1:1 + len(path)]) == path, example
    build_parser().parse_args(words[1:])
    assert "example:" in parser.format_help()
