"""The configuration reference (generated from ``VARIABLES``) names every variable the
package reads, and the misspelling check knows exactly those."""

import re
from pathlib import Path

from agora_pg.settings import KNOWN_VARIABLES, VARIABLES, unknown_variables

PACKAGE = Path(__file__).resolve().parents[2] / "agora_pg"


def variables_read_by_the_package() -> set[str]:
    names: set[str] = set()
    for module in PACKAGE.rglob("*.py"):
        names |= set(re.findall(r'"((?:AGORA_PG|WORKER)_[A-Z_]+)"', module.read_text(encoding="utf-8")))
    return names


def test_every_variable_the_package_reads_is_documented() -> None:
    read = variables_read_by_the_package()
    assert len(read) > 25
    assert read <= KNOWN_VARIABLES, f"documented nowhere: {sorted(read - KNOWN_VARIABLES)}"


def test_each_variable_is_documented_once_with_a_default_and_a_meaning() -> None:
    names = [name for variable in VARIABLES for name in variable.names]
    assert len(names) == len(set(names))
    assert all(variable.default and variable.meaning for variable in VARIABLES)


def test_a_documented_variable_is_never_called_unknown() -> None:
    assert unknown_variables({name: "1" for name in KNOWN_VARIABLES}) == []
    assert unknown_variables({"WORKER_CONCURENCY": "1"}) == [
        "unknown setting WORKER_CONCURENCY (ignored); did you mean WORKER_CONCURRENCY?"
    ]
