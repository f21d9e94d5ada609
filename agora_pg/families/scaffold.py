"""``agora-pg family new NAME``: a new job family from the template (``template/``),
with the project's ``families/shared/`` where it has none yet, and the family's tests."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from agora_pg.errors import ConfigError

TEMPLATE = Path(__file__).parent / "template"
NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")  # (whole: fullmatch, so no trailing newline passes)
PACKAGE_DOC = '"""The job families of this project (see families/shared)."""\n'


def new_family(name: str, project: Path) -> list[Path]:
    """Write family ``name`` into ``project`` (its ``families/`` and ``tests/unit/``);
    returns the files written. Nothing is overwritten: an existing family or test file
    is a ``ConfigError``."""
    if not NAME.fullmatch(name) or keyword.iskeyword(name) or name == "shared":
        raise ConfigError("NAME", f"{name!r} is no family name: lower-case letters, digits and _, starting with a "
                                  f"letter (a Python package and a job kind), and not 'shared'")
    families = project / "families"
    family = families / name
    test = project / "tests" / "unit" / f"test_{name}_pipeline.py"
    for path in (family, test):
        if path.exists():
            raise ConfigError("NAME", f"{path} exists already: a family is written only once")
    words = {"@@name@@": name, "@@Name@@": "".join(part.capitalize() for part in name.split("_"))}
    plan: list[tuple[Path, str]] = []
    if not (families / "__init__.py").exists():
        plan.append((families / "__init__.py", PACKAGE_DOC))
    for source in sorted((TEMPLATE / "shared").rglob("*.tmpl")):
        target = families / "shared" / _target(source.relative_to(TEMPLATE / "shared"), words)
        if not target.exists():
            plan.append((target, source.read_text(encoding="utf-8")))
    for source in sorted((TEMPLATE / "family").rglob("*.tmpl")):
        plan.append((family / _target(source.relative_to(TEMPLATE / "family"), words), _fill(source, words)))
    plan.append((test, _fill(TEMPLATE / "tests" / "test_family_pipeline.py.tmpl", words)))
    for path, text in plan:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return [path for path, _ in plan]


def _target(relative: Path, words: dict[str, str]) -> Path:
    text = str(relative.with_suffix(""))  # (without .tmpl)
    for word, value in words.items():
        text = text.replace(word, value)
    return Path(text)


def _fill(source: Path, words: dict[str, str]) -> str:
    text = source.read_text(encoding="utf-8")
    for word, value in words.items():
        text = text.replace(word, value)
    return text
