"""The queries of the docs' "SQL on run history" page run and answer, and so does the
README's."""

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from agora_pg import JobSpec, Queue
from agora_pg.db.store import Store

from .helpers import record_failure

REPO = Path(__file__).resolve().parents[2]
SQL_PAGE = REPO / "docs" / "guides" / "sql.md"


def documented_queries(page: Path = SQL_PAGE) -> list[str]:
    return re.findall(r"```sql\n(.*?)```", page.read_text(), flags=re.DOTALL)


async def test_the_readme_s_query_counts_the_queue(queue: Queue, store: Store) -> None:
    [query] = documented_queries(REPO / "README.md")
    await queue.enqueue_many([JobSpec("mail"), JobSpec("mail", queue="reports")])
    async with store.connection() as connection:
        rows = await connection.fetch(query)
    assert {(row["queue"], row["state"], row["jobs"]) for row in rows} == {("default", "pending", 1),
                                                                         ("reports", "pending", 1)}


async def test_documented_history_queries_run_on_real_history(queue: Queue, store: Store) -> None:
    queries = documented_queries()
    assert len(queries) == 7
    jobs = await queue.enqueue_many([JobSpec("mail"), JobSpec("mail"), JobSpec("report")])
    await store.workers.register("w1", "host", 1, ["default"])
    claimed = await store.jobs.claim(["default"], 3, "w1", 30, kinds=["mail", "report"])
    await store.jobs.complete_succeeded([(claimed[0].id, claimed[0].attempt)], "w1")
    await record_failure(store, claimed[1].id, claimed[1].attempt, "w1", "ValueError: x")
    async with store.connection() as connection:
        await connection.execute(
            "INSERT INTO agora.schedules (pipeline_id, schedule_kind, schedule_spec, next_run_at, consecutive_errors) "
            "VALUES ('healthy', 'every', 'every 60s', now() + interval '1 minute', 0), "
            "('failing', 'every', 'every 60s', now() + interval '1 minute', 2), "
            "('late', 'every', 'every 60s', now() - interval '5 minutes', 0)"
        )
        results = [await connection.fetch(sql) for sql in queries]
    failure_rate, slowest, stuck, worker_runs, troubled_schedules, queue_now, job_stats = results
    assert sum(row["attempts"] for row in failure_rate) == 2
    assert sum(row["failed"] for row in failure_rate) == 1
    assert [row["runs"] for row in slowest] == [1]
    assert stuck == []  # the third job is processing but young and leased
    assert {row["job_id"] for row in worker_runs} == {claimed[0].id, claimed[1].id}
    assert {row["pipeline_id"] for row in troubled_schedules} == {"failing", "late"}
    assert {(row["state"], row["jobs"]) for row in queue_now} == {("processing", 1), ("retrying", 1)}
    by_kind = {row["kind"]: row for row in job_stats}
    assert (by_kind["mail"]["done"], by_kind["mail"]["retrying"], by_kind["mail"]["succeeded_last_hour"]) == (1, 1, 1)
    assert by_kind["mail"]["failure_rate_last_hour"] == Decimal("0.5")
    assert by_kind["report"]["processing"] == 1 and by_kind["report"]["failure_rate_last_hour"] is None
    assert by_kind["mail"]["run_seconds_p50"] >= 0 and by_kind["mail"]["wait_seconds_p50"] >= 0
    assert len(jobs) == 3


async def test_queue_now_and_metrics_count_the_same_jobs(queue: Queue, store: Store) -> None:
    """A job failed for good is history: neither the documented query nor /metrics counts it;
    a job failed with a retry left is 'retrying' in both."""
    await queue.enqueue_many([JobSpec("k", max_retries=0), JobSpec("k", max_retries=3), JobSpec("k"),
                              JobSpec("later", run_at=datetime.now(UTC) + timedelta(hours=1))])
    await store.workers.register("w1", "host", 1, ["default"])
    claimed = await store.jobs.claim(["default"], 2, "w1", 30, kinds=["k", "later"])
    for job in claimed:
        await record_failure(store, job.id, job.attempt, "w1", "ValueError: x", delay=0)
    query = next(sql for sql in documented_queries() if "agora.queue_now" in sql)
    async with store.connection() as connection:
        rows = await connection.fetch(query)
    by_sql = {(row["queue"], row["state"]): row["jobs"] for row in rows}
    snapshot = await store.metrics()
    assert by_sql == {(queue_name, state): count for queue_name, state, count in snapshot.live_jobs}
    assert by_sql == {("default", "pending"): 2, ("default", "retrying"): 1}
    due = {row["queue"]: row["due"] for row in rows if row["state"] == "pending"}
    assert due == {"default": 1}
    assert snapshot.oldest_due_seconds["default"] >= 0
