"""What the operator commands print is safe for a terminal, whatever the database holds."""

from __future__ import annotations

import pytest


def test_jobs_show_and_list_print_escapes_not_terminal_commands(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import psycopg

    from agora_pg.cli import main

    with psycopg.connect(database_url, autocommit=True) as connection:  # (SQL: past the enqueue's checks)
        [(job_id,)] = connection.execute(
            "INSERT INTO agora.jobs (name, kind, queue, payload, status, finished_at, error_message, retry_count, "
            "max_retries) VALUES ('x', %s, 'default', '{}', 'failed', now(), %s, 1, 1) RETURNING id",
            ("mail\x1b[2J", "ValueError: \x1b]0;pwned\x07\u202egnp.exe")).fetchall()
    monkeypatch.setenv("AGORA_PG_DATABASE_URL", database_url)
    assert main(["jobs", "show", str(job_id)]) == 0
    assert main(["jobs", "list"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "mail\\x1b[2J" in out and "\\x1b]0;pwned\\x07\\u202egnp.exe" in out
