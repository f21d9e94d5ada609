"""Config-only workers and pipeline runs as real processes: the seed's TOML, a
100,000-row CSV killed halfway and resumed, dead letters listed and replayed."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
from pathlib import Path

import asyncpg
import pytest

from ..conftest import Processes
from ..faults import expire_leases_of
from .test_api_processes import REPO, cli
from .test_worker_processes import eventually, free_port, scalar, start_worker, stop, worker_env

SEED = REPO / "examples" / "pipelines.toml"


def run_cli(*args: str, env: dict[str, str], cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli("--log-level", "WARNING", *args), env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_run_config_runs_the_seed_once(database_url: str) -> None:
    result = run_cli("run", "--config", str(SEED), env=worker_env(database_url))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '{"id":1}'


async def test_worker_config_serves_the_seed_pipeline(database_url: str, processes: Processes) -> None:
    worker = processes.start(cli("worker", "--config", str(SEED), "--health-port", str(free_port())),
                             worker_env(database_url), REPO)

    async def ran() -> bool:
        return await scalar(database_url, "SELECT count(*) FROM agora.runs WHERE pipeline_id = 'orders'") == 1

    await eventually(ran, 30, "the orders pipeline to run")
    code, output = stop(worker)
    assert code == 0, output
    assert '{"id":1}' in output.splitlines()
    assert await scalar(database_url, "SELECT schedule_spec FROM agora.schedules WHERE pipeline_id = 'orders'") == "every 900s"


def test_a_wrong_config_fails_before_anything_runs(database_url: str, tmp_path: Path) -> None:
    config = tmp_path / "pipelines.toml"
    config.write_text(SEED.read_text().replace("minutes = 15", 'minutes = "15m"'))
    for args in (("worker", "--config", str(config)), ("run", "--config", str(config))):
        result = run_cli(*args, env=worker_env(database_url))
        assert result.returncode == 2, result
        assert result.stderr.strip().splitlines()[-1] == (
            'agora-pg: pipelines.orders.schedule.minutes: expected a positive number, got "15m"')
    missing = run_cli("run", "--config", str(tmp_path / "nope.toml"), env=worker_env(database_url))
    assert missing.returncode == 2 and "agora-pg: --config: cannot read" in missing.stderr
    config.write_text(SEED.read_text() + '[kinds."mail\\u001b[2J"]\nconcurrency = 1\n')  # a kind that clears a screen
    forged = run_cli("worker", "--config", str(config), env=worker_env(database_url))
    assert forged.returncode == 2 and "\x1b" not in forged.stderr, forged
    assert forged.stderr.strip().splitlines()[-1] == (
        "agora-pg: kinds.mail\\x1b[2J: expected a kind name: must not contain control or bidi characters, "
        "got 'mail\\\\x1b[2J'")


def _csv_config(tmp_path: Path, database_url: str, rows: int) -> Path:
    path = tmp_path / "events.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("id", "amount", "note"))
        writer.writerows((i, f"{i % 1000}.25", f"event {i}") for i in range(1, rows + 1))
    config = tmp_path / "ingest.toml"
    config.write_text(f'''format = "agora/v1"

[pipelines.ingest]
batch_size = 1000

[pipelines.ingest.source]
type = "csv"
path = "{path}"
schema = {{id = "int", amount = "decimal"}}

[pipelines.ingest.schedule]
mode = "once"

[[pipelines.ingest.sinks]]
type = "database"
database_url = "${{AGORA_PG_DATABASE_URL}}"
table = "public.events"
''')
    return config


async def _run_killed_after(database_url: str, processes: Processes, config: Path, rows: int) -> None:
    """``agora-pg run`` of ``config``, killed with SIGKILL once ``rows`` rows are written;
    its lease is then expired (the test drives the lease's time: see ``expire_leases_of``)."""
    first = processes.start(cli("run", "--config", str(config)), worker_env(database_url), REPO)

    async def written() -> bool:
        return int(await scalar(database_url, "SELECT count(*) FROM public.events")) >= rows  # type: ignore[arg-type]

    await eventually(written, 120, f"the first {rows:,} rows")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    assert await expire_leases_of(database_url, first) == 1


async def test_kill_9_halfway_through_a_csv_then_resume_writes_each_row_once(
    database_url: str, processes: Processes, tmp_path: Path
) -> None:
    await scalar(database_url, "CREATE TABLE public.events (id int PRIMARY KEY, amount numeric, note text)")
    config = _csv_config(tmp_path, database_url, 100_000)
    env = worker_env(database_url)
    await _run_killed_after(database_url, processes, config, 20_000)
    written = int(await scalar(database_url, "SELECT count(*) FROM public.events"))  # type: ignore[arg-type]
    assert written < 100_000, "the run finished before it could be killed; make the file larger"
    # Any worker's rescuer records the killed run once its lease has passed.
    worker = start_worker(processes, database_url)

    async def recorded() -> bool:
        return await scalar(database_url, "SELECT status FROM agora.runs WHERE pipeline_id = 'ingest'") == "abandoned"

    await eventually(recorded, 60, "the killed run recorded by the other worker's rescuer")
    assert (await scalar(database_url, "SELECT error_type FROM agora.runs WHERE pipeline_id = 'ingest'")) == "WorkerLost"
    code, output = stop(worker)
    assert code == 0, output
    resumed = run_cli("run", "--config", str(config), env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert await scalar(database_url, "SELECT count(*) FROM public.events") == 100_000
    assert await scalar(database_url, "SELECT count(DISTINCT id) FROM public.events") == 100_000
    assert await scalar(database_url, "SELECT (position #>> '{}')::int FROM agora.checkpoints WHERE pipeline_id = 'ingest'") == 100_000
    statuses = await scalar(database_url, "SELECT string_agg(status, ',' ORDER BY id) FROM agora.runs WHERE pipeline_id = 'ingest'")
    assert statuses == "abandoned,succeeded"


async def test_a_run_started_while_a_killed_one_holds_the_pipeline_waits_and_rescues_it(
    database_url: str, processes: Processes, tmp_path: Path
) -> None:
    await scalar(database_url, "CREATE TABLE public.events (id int PRIMARY KEY, amount numeric, note text)")
    config = _csv_config(tmp_path, database_url, 100_000)
    env = worker_env(database_url)
    await _run_killed_after(database_url, processes, config, 1)
    second = run_cli("run", "--config", str(config), env=env, timeout=300)  # no other worker runs
    assert second.returncode == 0, second.stderr
    assert "a run is in flight" in second.stderr  # it said why it waited
    statuses = await scalar(database_url, "SELECT string_agg(status, ',' ORDER BY id) FROM agora.runs WHERE pipeline_id = 'ingest'")
    assert statuses == "abandoned,succeeded"
    assert await scalar(database_url, "SELECT count(DISTINCT id) FROM public.events") == 100_000


async def test_dlq_list_and_replay(database_url: str, tmp_path: Path) -> None:
    await scalar(database_url, "CREATE TABLE public.events (id int PRIMARY KEY, amount numeric CHECK (amount >= 0), note text)")
    config = _csv_config(tmp_path, database_url, 5)
    csv_path = tmp_path / "events.csv"
    csv_path.write_text(csv_path.read_text().replace("3,3.25", "3,-3.25"))
    env = worker_env(database_url)
    assert run_cli("run", "--config", str(config), env=env).returncode == 0
    listed = run_cli("dlq", "list", "--pipeline", "ingest", env=env)
    assert listed.returncode == 0
    assert "CheckViolationError" in listed.stdout and "sink:database:public.events" in listed.stdout
    await scalar(database_url, "ALTER TABLE public.events DROP CONSTRAINT events_amount_check")
    replayed = run_cli("dlq", "replay", "--config", str(config), "--pipeline", "ingest", env=env)
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 1 dead letters of ingest: 1 written, 0 rejected again" in replayed.stdout
    assert await scalar(database_url, "SELECT amount FROM public.events WHERE id = 3") == -3.25
    assert "CheckViolationError" not in run_cli("dlq", "list", "--pipeline", "ingest", env=env).stdout


@pytest.mark.parametrize("fault", ["kill -9", "connection terminated"])
async def test_a_replay_stopped_at_the_mark_leaves_every_id_once(
    database_url: str, tmp_path: Path, processes: Processes, fault: str
) -> None:
    """8,000 dead letters replayed by `agora-pg dlq replay`, held at the moment it marks them
    replayed (the test holds their rows' locks) and then killed with kill -9, or its
    connection terminated there; the next replay (which rescues a killed one) leaves
    every id in the table exactly once and no letter waiting. Before the mark shared the
    rows' transaction, the rows had committed by then and were written again."""
    await scalar(database_url, "CREATE TABLE public.events (id int PRIMARY KEY, amount numeric CHECK (amount >= 0), note text)")
    config = _csv_config(tmp_path, database_url, 10_000)
    config.write_text(config.read_text() + "\n[pipelines.ingest.dead_letters]\nmax_per_run = 10000\n")
    csv_path = tmp_path / "events.csv"
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join([lines[0], *(line.replace(",", ",-", 1) if n % 5 else line
                                              for n, line in enumerate(lines[1:], 1))]) + "\n")
    env = worker_env(database_url)
    assert run_cli("run", "--config", str(config), env=env).returncode == 0
    assert await scalar(database_url, "SELECT count(*) FROM agora.dead_letters WHERE replayed_at IS NULL") == 8_000
    await scalar(database_url, "ALTER TABLE public.events DROP CONSTRAINT events_amount_check")
    holder = await asyncpg.connect(database_url)
    locks = holder.transaction()
    await locks.start()
    await holder.execute("SELECT id FROM agora.dead_letters FOR UPDATE")  # (the mark waits for these)
    replay = processes.start(cli("dlq", "replay", "--config", str(config), "--pipeline", "ingest", "--limit", "10000"),
                             env, REPO)
    marking = ("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
               "AND query LIKE 'UPDATE agora.dead_letters SET replayed_at%'")

    async def at_the_mark() -> bool:
        return await scalar(database_url, marking) is not None

    try:
        await eventually(at_the_mark, 60, "the replay to wait at its mark")
        if fault == "kill -9":
            replay.send_signal(signal.SIGKILL)
        else:
            await scalar(database_url, f"SELECT pg_terminate_backend(({marking}))")
        replay.wait(timeout=60)
    finally:
        await locks.rollback()
        await holder.close()
    if fault == "kill -9":
        await expire_leases_of(database_url, replay)
    again = run_cli("dlq", "replay", "--config", str(config), "--pipeline", "ingest", "--limit", "10000", env=env)
    assert again.returncode == 0, again.stderr
    counts = await scalar(database_url, "SELECT array[count(*), count(DISTINCT id)] FROM public.events")
    assert counts == [10_000, 10_000], f"{counts}: {again.stdout} {again.stderr}"
    assert await scalar(database_url, "SELECT count(*) FROM agora.dead_letters WHERE replayed_at IS NULL") == 0


def test_run_config_exports_spans_to_the_console(database_url: str, tmp_path: Path) -> None:
    config = tmp_path / "traced.toml"
    config.write_text(SEED.read_text().replace('service_name = "orders-worker"',
                                               'service_name = "orders-worker"\nexporter = "console"'))
    result = run_cli("run", "--config", str(config), env=worker_env(database_url))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == '{"id":1}'
    assert '"name": "pipeline.run"' in result.stdout and '"name": "pipeline.batch"' in result.stdout
    assert '"service.name": "orders-worker"' in result.stdout
    assert '"pipeline.id": "orders"' in result.stdout


@pytest.mark.one_lane
def test_seed_config_on_a_fresh_embedded_server_needs_no_other_step(tmp_path: Path) -> None:
    """No DATABASE_URL: the command migrates the embedded server itself, then runs."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WORKER_", "AGORA_PG_", "DATABASE_URL"))}
    env["AGORA_PG_DATA_DIR"] = str(tmp_path / ".agora-pg")
    config = tmp_path / "pipelines.toml"
    config.write_bytes(SEED.read_bytes())  # a new user copies the file
    result = run_cli("run", "--config", str(config), env=env, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '{"id":1}'
