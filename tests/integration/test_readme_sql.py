"""The queries of the README's "Querying run history with SQL" section run and answer."""

import re
from pathlib import Path

from agora_pg import JobSpec, Queue
from agora_pg.db.store import Store

from .helpers import record_failure

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_queries() -> list[str]:
    text = README.read_text()
    section = text.split("## Querying run history with SQL", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sql\n(.*?)```", section, flags=re.DOTALL)


async def test_readme_history_queries_run_on_real_history(queue: Queue, store: Store) -> None:
    queries = readme_queries()
    assert len(queries) == 6
    jobs = await queue.enqueue_many([JobSpec("mail"), JobSpec("mail"), JobSpec("report")])
    await store.register_worker("w1", "host", 1, ["default"])
    claimed = await store.claim_jobs(["default"], 3, "w1", 30)
    await store.complete_succeeded([(claimed[0].id, claimed[0].attempt)], "w1")
    await record_failure(store, claimed[1].id, claimed[1].attempt, "w1", "ValueError: x")
    async with store.connection() as connection:
        await connection.execute(
            "INSERT INTO agora.schedules (pipeline_id, schedule_kind, schedule_spec, next_run_at, consecutive_errors) "
            "VALUES ('healthy', 'every', 'every 60s', now() + interval '1 minute', 0), "
            "('failing', 'every', 'every 60s', now() + interval '1 minute', 2), "
            "('late', 'every', 'every 60s', now() - interval '5 minutes', 0)"
        )
        results = [await connection.fetch(sql) for sql in queries]
    failure_rate, slowest, stuck, worker_runs, troubled_schedules, overview = results
    assert sum(row["attempts"] for row in failure_rate) == 2
    assert sum(row["failed"] for row in failure_rate) == 1
    assert [row["runs"] for row in slowest] == [1]
    assert stuck == []  # the third job is processing but young and leased
    assert {row["job_id"] for row in worker_runs} == {claimed[0].id, claimed[1].id}
    assert {row["pipeline_id"] for row in troubled_schedules} == {"failing", "late"}
    assert sum(row["jobs"] for row in overview) == 2  # one processing, one failed and retrying
    assert len(jobs) == 3
