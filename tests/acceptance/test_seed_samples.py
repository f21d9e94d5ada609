"""The samples of the runner document (``../shared/seeds/000_680cffeb6f2d77fe.txt``),
held here verbatim and run as written. Two changes are made, mechanically, as the
README says: ``agora.runner`` is ``agora_pg.runner``, and top-level ``await`` runs in
an event loop (compiled with ``PyCF_ALLOW_TOP_LEVEL_AWAIT``, as an asyncio REPL
does). The names a sample uses without importing them (``connect_db``, ``settings``,
``Pipeline``, ...) are given to it, as the document's surrounding project would."""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import httpx
import pytest

from agora_pg import connect_db
from agora_pg.pipelines import CsvSource, DatabaseSink, Pipeline

from ..conftest import Processes
from .test_worker_processes import eventually, free_port, scalar, worker_env

pytestmark = pytest.mark.acceptance

FACTORY_SAMPLE = '''\
from agora.runner import Schedule, ScheduledPipeline

async def build_pipeline():
    db = await connect_db(settings.DATABASE_URL)
    return (
        Pipeline(CsvSource("events.csv"), id="events_ingest")
        .build(DatabaseSink(db))
    )

scheduled = ScheduledPipeline(
    factory=build_pipeline,
    schedule=Schedule.every(hours=1),
    pipeline_id="events_ingest",
)
await scheduled.start()  # blocks until stopped
'''

SCHEDULE_TYPES_SAMPLES = '''\
Schedule.every(seconds=30)
Schedule.every(minutes=15)
Schedule.every(hours=6)
Schedule.every(days=1)
Schedule.cron("0 */6 * * *")   # every 6 hours on the hour
Schedule.cron("0 2 * * *")     # daily at 02:00
Schedule.continuous()
Schedule.once()
'''

ONE_SHOT_SAMPLE = '''\
# One-shot: run and exit
scheduled = ScheduledPipeline(
    factory=build_pipeline,
    schedule=Schedule.once(),
    pipeline_id="backfill_2024",
)
await scheduled.start()
'''

ERROR_HANDLING_SAMPLE = '''\
scheduled = ScheduledPipeline(
    factory=build_pipeline,
    schedule=Schedule.every(hours=1),
    pipeline_id="events_ingest",
    error_backoff_seconds=30.0,    # base delay after first failure
    max_consecutive_errors=5,      # stop after 5 failures in a row
)
'''

POOL_SAMPLE = '''\
from agora.runner import WorkerPool

pool = WorkerPool(
    health_port=8080,
    graceful_shutdown_timeout=30.0,
)

pool.register(ScheduledPipeline(
    factory=build_ingest_pipeline,
    schedule=Schedule.every(hours=6),
    pipeline_id="events_ingest",
))

pool.register(ScheduledPipeline(
    factory=build_consumer_pipeline,
    schedule=Schedule.continuous(),
    pipeline_id="events_consumer",
))

await pool.run()  # blocks until shutdown
'''

CHAIN_SAMPLE = "pool.register(sp1).register(sp2).register(sp3)\n"

WORKER_MODULE_SAMPLE = '''\
# myproject/worker.py
from agora.runner import Schedule, ScheduledPipeline, WorkerPool
from myproject.pipelines import build_consumer, build_ingest


def get_worker() -> WorkerPool:
    pool = WorkerPool(health_port=8080)
    pool.register(
        ScheduledPipeline(
            factory=build_ingest,
            schedule=Schedule.every(hours=1),
            pipeline_id="ingest",
        )
    )
    pool.register(
        ScheduledPipeline(
            factory=build_consumer,
            schedule=Schedule.continuous(),
            pipeline_id="consumer",
        )
    )
    return pool
'''

CONFIG_SAMPLE = '''\
format = "agora/v1"

[worker]
health_port = 8080

[pipelines.orders.source]
type = "iterable"
records = [{id = 1}]

[pipelines.orders.schedule]
mode = "every"
minutes = 15

[pipelines.orders.tracing]
enabled = true
backend = "opentelemetry"
service_name = "orders-worker"

[[pipelines.orders.sinks]]
type = "stdout"
'''

EVENTS_TABLE = "CREATE TABLE public.events_ingest (id int PRIMARY KEY, kind text NOT NULL, amount numeric, at timestamptz)"


def as_written(sample: str) -> str:
    """The sample with the package's name: the one change besides running its awaits."""
    return sample.replace("from agora.runner import", "from agora_pg.runner import")


async def run_sample(sample: str, namespace: dict[str, Any]) -> Any:
    code = compile(as_written(sample), "<seed sample>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)  # noqa: S307 - the seed's own code
    if asyncio.iscoroutine(result):
        return await result
    return result


def write_events(path: Path, first: int, count: int) -> None:
    lines = [] if path.exists() else ["id,kind,amount,at"]
    lines += [f"{i},signup,{i}.25,2026-11-30T10:00:00+00:00" for i in range(first, first + count)]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


@pytest.fixture
def project(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The seed's surroundings: its working directory, its settings and the names it uses."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGORA_PG_DATABASE_URL", database_url)
    monkeypatch.setenv("WORKER_HEALTH_PORT", "0")  # the samples' 8080 may be taken on this machine
    settings = types.SimpleNamespace(DATABASE_URL=database_url)
    return {"__name__": "seed_sample", "settings": settings, "connect_db": connect_db, "Pipeline": Pipeline,
            "CsvSource": CsvSource, "DatabaseSink": DatabaseSink}


async def test_the_factory_sample_loads_the_csv_then_the_one_shot_runs_at_each_launch(
    project: dict[str, Any], database_url: str, tmp_path: Path
) -> None:
    await scalar(database_url, EVENTS_TABLE)
    write_events(tmp_path / "events.csv", 1, 3)
    started = asyncio.ensure_future(run_sample(FACTORY_SAMPLE, project))

    async def loaded() -> bool:
        assert not started.done() or started.exception() is None, started.exception()
        return await scalar(database_url, "SELECT count(*) FROM public.events_ingest") == 3

    await eventually(loaded, 30, "the CSV in public.events_ingest")
    project["scheduled"].stop()  # as SIGTERM would
    await asyncio.wait_for(started, 30)
    assert await scalar(database_url, "SELECT sum(amount)::text FROM public.events_ingest") == "6.75"

    for launch in (1, 2):  # launched by cron or Airflow, day after day: each launch runs once
        write_events(tmp_path / "events.csv", 100 * launch, 2)
        await asyncio.wait_for(run_sample(ONE_SHOT_SAMPLE, project), 30)
        assert await scalar(database_url, "SELECT count(*) FROM public.events_ingest") == 3 + 2 * launch
    statuses = await scalar(database_url, "SELECT string_agg(status, ',' ORDER BY id) FROM agora.runs "
                                          "WHERE pipeline_id = 'backfill_2024'")
    assert statuses == "succeeded,succeeded"


async def test_schedule_types_and_error_handling_samples_build_what_they_say(project: dict[str, Any]) -> None:
    await run_sample("from agora.runner import Schedule, ScheduledPipeline\n", project)
    specs = [eval(as_written(line), project).spec for line in SCHEDULE_TYPES_SAMPLES.splitlines()]  # noqa: S307
    assert specs == ["every 30s", "every 900s", "every 21600s", "every 86400s", "cron 0 */6 * * * UTC",
                     "cron 0 2 * * * UTC", "continuous", "once"]

    async def build_pipeline() -> object:
        raise AssertionError("not run here")

    project["build_pipeline"] = build_pipeline
    await run_sample(ERROR_HANDLING_SAMPLE, project)
    scheduled = project["scheduled"]
    assert (scheduled.error_backoff_seconds, scheduled.max_consecutive_errors) == (30.0, 5)


async def test_the_pool_sample_runs_both_pipelines_and_register_chains(
    project: dict[str, Any], database_url: str
) -> None:
    ran: dict[str, int] = {"ingest": 0, "consumer": 0}

    class Counted:
        def __init__(self, name: str) -> None:
            self.name = name

        async def run(self) -> None:
            ran[self.name] += 1
            await asyncio.sleep(0.01)

    async def build_ingest_pipeline() -> Counted:
        return Counted("ingest")

    async def build_consumer_pipeline() -> Counted:
        return Counted("consumer")

    project.update(build_ingest_pipeline=build_ingest_pipeline, build_consumer_pipeline=build_consumer_pipeline)
    await run_sample("from agora.runner import Schedule, ScheduledPipeline\n", project)
    running = asyncio.ensure_future(run_sample(POOL_SAMPLE, project))
    await eventually(lambda: ran["ingest"] >= 1 and ran["consumer"] >= 3, 30, "both pipelines running")
    pool = project["pool"]
    assert pool.health is not None and pool.health.port != 8080
    async with httpx.AsyncClient() as client:
        ready = await client.get(f"http://127.0.0.1:{pool.health.port}/ready")
    assert ready.status_code == 200 and set(ready.json()["pipelines"]) == {"events_ingest", "events_consumer"}
    pool.stop()  # as the first SIGINT/SIGTERM does
    await asyncio.wait_for(running, 30)
    assert ran["ingest"] == 1  # every 6 hours: once so far

    from agora_pg.runner import ScheduledPipeline, WorkerPool

    project["pool"] = WorkerPool()
    for name in ("sp1", "sp2", "sp3"):
        project[name] = ScheduledPipeline(build_consumer_pipeline, project["Schedule"].continuous(), name)
    assert await run_sample(CHAIN_SAMPLE, project) is None  # (a statement)
    assert [p.pipeline_id for p in project["pool"].pipelines] == ["sp1", "sp2", "sp3"]


PIPELINES_MODULE = '''\
"""The seed's myproject.pipelines: the two factories its worker.py imports."""

import os

import asyncpg


class Recorded:
    def __init__(self, name):
        self.name = name

    async def run(self):
        connection = await asyncpg.connect(os.environ["AGORA_PG_DATABASE_URL"])
        try:
            await connection.execute("INSERT INTO public.seed_runs (name) VALUES ($1)", self.name)
        finally:
            await connection.close()


async def build_ingest():
    return Recorded("ingest")


async def build_consumer():
    return Recorded("consumer")
'''


def start_cli(processes: Processes, cwd: Path, database_url: str, *args: str) -> subprocess.Popen[bytes]:
    env = worker_env(database_url, WORKER_HEALTH_PORT=str(free_port()), AGORA_PG_LOG_LEVEL="WARNING")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), env.get("PYTHONPATH")]))
    return processes.start([sys.executable, "-m", "agora_pg.cli", *args], env, cwd)


def stop_gracefully(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    os.kill(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    return process.returncode, output.decode(errors="replace")


async def test_the_worker_py_convention_runs_under_agora_pg_worker_module(
    database_url: str, processes: Processes, tmp_path: Path
) -> None:
    await scalar(database_url, "CREATE TABLE public.seed_runs (id bigserial, name text)")
    package = tmp_path / "myproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pipelines.py").write_text(PIPELINES_MODULE)
    (package / "worker.py").write_text(as_written(WORKER_MODULE_SAMPLE))
    worker = start_cli(processes, tmp_path, database_url, "worker", "--module", "myproject.worker")

    async def both_ran() -> bool:
        assert worker.poll() is None, worker.communicate()[0].decode(errors="replace")
        names = await scalar(database_url, "SELECT string_agg(DISTINCT name, ',' ORDER BY name) FROM public.seed_runs")
        return names == "consumer,ingest"

    await eventually(both_ran, 60, "both pipelines of myproject.worker")
    code, output = stop_gracefully(worker)
    assert code == 0, output
    assert await scalar(database_url, "SELECT count(*) FROM public.seed_runs WHERE name = 'ingest'") == 1


async def test_the_config_only_worker_runs_under_agora_pg_worker_config(
    database_url: str, processes: Processes, tmp_path: Path
) -> None:
    (tmp_path / "pipelines.toml").write_text(CONFIG_SAMPLE)
    worker = start_cli(processes, tmp_path, database_url, "worker", "--config", "pipelines.toml")

    async def ran() -> bool:
        assert worker.poll() is None, worker.communicate()[0].decode(errors="replace")
        return await scalar(database_url, "SELECT count(*) FROM agora.runs WHERE pipeline_id = 'orders' "
                                          "AND status = 'succeeded'") == 1

    await eventually(ran, 60, "the orders pipeline's first run")
    code, output = stop_gracefully(worker)
    assert code == 0, output
    assert '{"id":1}' in output  # the stdout sink
