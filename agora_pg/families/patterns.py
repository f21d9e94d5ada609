"""Message templates of a family (``resources/patterns/*.yaml``), merged into one
registry that its stages receive as ``patterns``. Pure.

A file ``reminder.yaml`` holding ``email: "Dear {name}, ..."`` gives the pattern
``reminder.email`` (nested mappings add a level each). ``render`` fills a pattern's
``{fields}`` (plain names, given as text); a field with no value (absent, None or blank) is a
``MissingTemplateVariable`` naming the pattern, its file and line, never a message
with a hole in it.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agora_pg.errors import AgoraError
from agora_pg.families.spec_files import FamilySpecError, Mapping, read_yaml


class MissingTemplateVariable(AgoraError):
    """A pattern was rendered without a value for one of its fields."""

    def __init__(self, key: str, where: str, missing: list[str]) -> None:
        super().__init__(f"pattern {key} ({where}) needs a value for {', '.join(missing)}: none was given")
        self.key = key
        self.missing = missing


class UnknownPattern(AgoraError, LookupError):
    """A stage asked for a pattern the family's files do not have."""


@dataclasses.dataclass(frozen=True)
class Pattern:
    key: str
    text: str
    fields: frozenset[str]  # the names its {fields} use
    path: Path
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}, line {self.line}"


class Patterns:
    """The patterns of a family by key; see the module docstring."""

    def __init__(self, patterns: Iterable[Pattern] = ()) -> None:
        self._patterns = {pattern.key: pattern for pattern in patterns}

    @classmethod
    def read(cls, directory: Path) -> Patterns:
        """Every ``*.yaml`` of ``directory`` (none: no patterns); a key two files give is an error."""
        found: dict[str, Pattern] = {}
        for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
            document = read_yaml(path)
            if document is None:
                continue
            if not isinstance(document, Mapping):
                raise FamilySpecError(path, None, "a patterns file is a mapping of names to texts")
            for pattern in _flatten(path, path.stem, document):
                if pattern.key in found:
                    raise FamilySpecError(path, pattern.line, f"pattern {pattern.key} is given twice "
                                                                f"(also at {found[pattern.key].where})")
                found[pattern.key] = pattern
        return cls(found.values())

    def keys(self) -> list[str]:
        return sorted(self._patterns)

    def __contains__(self, key: object) -> bool:
        return key in self._patterns

    def render(self, key: str, **values: Any) -> str:
        """Pattern ``key`` with its fields filled from ``values``."""
        pattern = self._patterns.get(key)
        if pattern is None:
            raise UnknownPattern(f"no pattern {key!r} (the family has: {', '.join(self.keys()) or 'none'})")
        missing = sorted(name for name in pattern.fields if _blank(values.get(name)))
        if missing:
            raise MissingTemplateVariable(key, pattern.where, missing)
        return pattern.text.format_map({name: str(values[name]) for name in pattern.fields})


def _flatten(path: Path, prefix: str, mapping: Mapping) -> Iterable[Pattern]:
    for name, value in mapping.items():
        key, line = f"{prefix}.{name}", mapping.lines[name]
        if isinstance(value, Mapping):
            yield from _flatten(path, key, value)
        elif isinstance(value, str):
            yield Pattern(key, value, _fields(path, line, key, value), path, line)
        else:
            raise FamilySpecError(path, line, f"pattern {key} must be a text or a mapping of them")


def _fields(path: Path, line: int, key: str, text: str) -> frozenset[str]:
    """The names ``text``'s fields use; anything but a name (a position, an attribute, an
    index, a conversion, a format spec: more than the values given) is an error."""
    names = set()
    try:
        for _literal, field, spec, conversion in string.Formatter().parse(text):
            if field is None:
                continue
            if not field.isidentifier() or spec or conversion:
                written = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                raise FamilySpecError(path, line, f"pattern {key}: a field is a name and nothing else "
                                                  f"({{name}}), not {{{written}}}")
            names.add(field)
    except ValueError as error:
        raise FamilySpecError(path, line, f"pattern {key}: {error} (write {{{{ and }}}} for braces)") from None
    return frozenset(names)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())

