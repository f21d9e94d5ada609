"""Every Python sample of the README runs as shown, each in a fresh interpreter, on a
database of the test's own (top-level ``await`` as in ``python -m asyncio``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_worker_processes import scalar, worker_env

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
RUNNER = Path(__file__).resolve().parent / "readme_sample.py"
pytestmark = pytest.mark.acceptance


def python_samples() -> list[tuple[int, str]]:
    """(line number, code) of every ```python block."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, match.start()) + 1, match.group(1))
            for match in re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL)]


SAMPLES = python_samples()


def test_the_readme_has_python_samples() -> None:
    assert len(SAMPLES) >= 8


@pytest.mark.parametrize(("line", "code"), SAMPLES, ids=[f"line {line}" for line, _ in SAMPLES])
async def test_readme_sample_runs_as_shown(line: int, code: str, database_url: str, tmp_path: Path) -> None:
    await scalar(database_url, "CREATE TABLE public.events_ingest (id int PRIMARY KEY, amount numeric, note text)")
    (tmp_path / "events.csv").write_text("id,amount,note\n1,2.50, first \n2,,second\n", encoding="utf-8")
    sample = tmp_path / f"readme_line_{line}.py"
    sample.write_text(code, encoding="utf-8")
    result = subprocess.run([sys.executable, str(RUNNER), str(sample)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=worker_env(database_url, WORKER_HEALTH_PORT="0",
                                                        AGORA_PG_LOG_LEVEL="WARNING", PYTHONPATH=str(REPO)))
    assert result.returncode == 0, f"README line {line}:\n{code}\n--- stderr:\n{result.stderr}"
    failed = await scalar(database_url, "SELECT string_agg(error_message, '; ') FROM agora.runs WHERE status = 'failed' "
                                        "AND error_type <> 'ConnectionError'")  # (the errors sample fails on purpose)
    assert failed is None, f"README line {line}: a run failed: {failed}"
    if "CsvSource(" in code:  # the CSV sample loads the file's one row with an amount
        assert await scalar(database_url, "SELECT note FROM public.events_ingest") == "first"
