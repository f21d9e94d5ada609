"""``agora-pg family new``: a new family whose own generated tests pass at once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "agora_pg" / "families" / "template"


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.one_lane
def test_a_new_family_passes_its_own_tests_at_once(tmp_path: Path) -> None:
    made = run([sys.executable, "-m", "agora_pg.cli", "family", "new", "demo_notice", "--path", str(tmp_path)], REPO)
    assert made.returncode == 0, made.stderr
    assert "families/demo_notice/impl.py" in made.stdout and "tests/unit/test_demo_notice_pipeline.py" in made.stdout
    for relative in ("abc.py", "impl.py", "pipeline.yaml", "resources/pipeline.yaml",
                     "resources/patterns/demo_notice.yaml"):
        assert (tmp_path / "families" / "demo_notice" / relative).is_file(), relative
    for relative in ("ports.py", "loader.py", "registry.py"):
        assert (tmp_path / "families" / "shared" / relative).is_file(), relative
    command = re.search(r"run its tests \((python -m pytest[^)]*)\)", made.stdout)
    assert command is not None and " -n0 " in command.group(1), made.stdout  # (xdist is installed here)
    tests = run([sys.executable, *command.group(1).split()[1:3], "-q", "-p", "no:cacheprovider",
                 *command.group(1).split()[3:]], tmp_path)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "4 passed" in tests.stdout

    again = run([sys.executable, "-m", "agora_pg.cli", "family", "new", "demo_notice", "--path", str(tmp_path)], REPO)
    assert again.returncode == 2 and again.stderr.strip().endswith("exists already: a family is written only once")
    second = run([sys.executable, "-m", "agora_pg.cli", "family", "new", "other_notice", "--path", str(tmp_path)],
                 REPO)
    assert second.returncode == 0, second.stderr
    assert "families/shared" not in second.stdout  # the project's shared files are kept as they are
    bad = run([sys.executable, "-m", "agora_pg.cli", "family", "new", "class", "--path", str(tmp_path)], REPO)
    assert bad.returncode == 2 and "'class' is no family name" in bad.stderr


def test_this_projects_shared_files_are_the_templates() -> None:
    # families/shared/ of this repository is what `family new` writes into a project without one
    for name in ("__init__.py", "loader.py", "registry.py"):
        assert (REPO / "families" / "shared" / name).read_text() == (TEMPLATE / "shared" / f"{name}.tmpl").read_text()
