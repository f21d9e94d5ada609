"""Every Python sample of the README and of the docs site runs as shown, each in a fresh
interpreter, in an empty folder, on a database of the test's own (top-level ``await`` as
in ``python -m asyncio``). What a sample needs, its page shows, and only that is made: a
block with a file name (```` ```csv title="events.csv" ````) is written into the folder,
and a ```` ```sql title="psql" ```` block is run on the database first."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_worker_processes import scalar, worker_env

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
RUNNER = Path(__file__).resolve().parent / "doc_sample.py"
pytestmark = pytest.mark.acceptance


def python_samples() -> list[tuple[str, str]]:
    """("page:line", code) of every ```python block of the README and the docs."""
    samples = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        samples += [(f"{page.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}", match.group(1))
                    for match in re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL)]
    return samples


def shown_beside(where: str) -> tuple[dict[str, str], list[str]]:
    """The files (name: text) and the SQL to run first that the page of ``where`` shows."""
    text = (REPO / where.split(":")[0]).read_text(encoding="utf-8")
    blocks = re.findall(r'```\w+ title="([^"]+)"\n(.*?)```', text, flags=re.DOTALL)
    return {name: body for name, body in blocks if name != "psql"}, [body for name, body in blocks if name == "psql"]


SAMPLES = python_samples()


def test_the_readme_and_the_docs_have_python_samples() -> None:
    pages = {where.split(":")[0] for where, _ in SAMPLES}
    assert "README.md" in pages and len(SAMPLES) >= 15


@pytest.mark.parametrize(("where", "code"), SAMPLES, ids=[where for where, _ in SAMPLES])
async def test_doc_sample_runs_as_shown(where: str, code: str, database_url: str, tmp_path: Path) -> None:
    files, statements = shown_beside(where)
    for statement in statements:
        await scalar(database_url, statement)
    for name, body in files.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    sample = tmp_path / "sample.py"
    sample.write_text(code, encoding="utf-8")
    result = subprocess.run([sys.executable, str(RUNNER), str(sample)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=worker_env(database_url, WORKER_HEALTH_PORT="0",
                                                        AGORA_PG_LOG_LEVEL="WARNING", PYTHONPATH=str(REPO)))
    assert result.returncode == 0, f"{where}:\n{code}\n--- stderr:\n{result.stderr}"
    failed = await scalar(database_url, "SELECT string_agg(error_message, '; ') FROM agora.runs WHERE status = 'failed' "
                                        "AND error_type <> 'ConnectionError'")  # (the errors sample fails on purpose)
    assert failed is None, f"{where}: a run failed: {failed}"
    if "CsvSource(" in code:  # the CSV sample loads the file's one row with an amount
        assert await scalar(database_url, "SELECT note FROM public.events_ingest") == "first"
