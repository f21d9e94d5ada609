"""Reading a family's YAML files with the line of every key and item, so that an error
names the file and the line (``FamilySpecError``). Pure: no I/O but reading the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agora_pg.errors import AgoraError

MAX_FILE_BYTES = 1_000_000  # a family file is written by hand: far below this
MAX_DEPTH = 50  # nesting of mappings and sequences (the composer is recursive)


class FamilySpecError(AgoraError):
    """A family's graph spec, runtime spec or patterns are wrong: the message names the
    file, the line and what is wrong there."""

    def __init__(self, path: Path | str, line: int | None, problem: str) -> None:
        where = f"{path}, line {line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.line = line
        self.problem = problem


class Mapping(dict[str, Any]):
    """A YAML mapping, with the line of each key (``lines``) and of itself (``line``)."""

    line: int
    lines: dict[str, int]


class Sequence(list[Any]):
    """A YAML sequence, with the line of each item (``lines``) and of itself (``line``)."""

    line: int
    lines: list[int]


def read_yaml(path: Path) -> Any:
    """The document of ``path``: mappings and sequences carry their lines; a duplicate
    key, a key that is not text or YAML that does not parse is a ``FamilySpecError``."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise FamilySpecError(path, None, f"larger than {MAX_FILE_BYTES:,} bytes: a family file is not data")
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise FamilySpecError(path, None, f"cannot read it ({error.strerror or error})") from None
    try:
        depth = 0  # (read as events first: nothing is built or expanded before these checks)
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            line = None if event.start_mark is None else event.start_mark.line + 1
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise FamilySpecError(path, line, "anchors and aliases (& and *) are not allowed")
            depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
            if depth > MAX_DEPTH:
                raise FamilySpecError(path, line, f"nested deeper than {MAX_DEPTH} levels")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        problem = getattr(error, "problem", None) or str(error)
        raise FamilySpecError(path, None if mark is None else mark.line + 1, f"not YAML: {problem}") from None
    return None if node is None else _convert(path, node, yaml.SafeLoader(""))


def _convert(path: Path, node: yaml.Node, loader: yaml.SafeLoader) -> Any:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        mapping = Mapping()
        mapping.line, mapping.lines = line, {}
        for key_node, value_node in node.value:
            key = _convert(path, key_node, loader)
            key_line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise FamilySpecError(path, key_line, f"a key must be text, got {key!r}")
            if key in mapping:
                raise FamilySpecError(path, key_line, f"{key!r} appears twice (first on line {mapping.lines[key]})")
            mapping[key] = _convert(path, value_node, loader)
            mapping.lines[key] = key_line
        return mapping
    if isinstance(node, yaml.SequenceNode):
        sequence = Sequence(_convert(path, item, loader) for item in node.value)
        sequence.line, sequence.lines = line, [item.start_mark.line + 1 for item in node.value]
        return sequence
    return loader.construct_object(node, deep=True)


def require_mapping(path: Path, value: Any, what: str, line: int | None) -> Mapping:
    if not isinstance(value, Mapping):
        raise FamilySpecError(path, line, f"{what} must be a mapping, got {_kind(value)}")
    return value


def require_text(path: Path, value: Any, what: str, line: int | None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise FamilySpecError(path, line, f"{what} must be a non-empty text, got {_kind(value)}")
    return value.strip()


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)
