"""The agora/v1 config: the seed's file, every option, every error path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agora_pg.config import load_config
from agora_pg.errors import ConfigError
from agora_pg.schedules import Schedule

SEED = (Path(__file__).resolve().parents[2] / "examples" / "pipelines.toml").read_text()

FULL = """
format = "agora/v1"
[worker]
health_port = 0
graceful_shutdown_timeout = 12.5

[pipelines.ingest]
id = "events_ingest"
batch_size = 500
error_backoff_seconds = 30
max_consecutive_errors = 5
[pipelines.ingest.source]
type = "csv"
path = "events.csv"
schema = {id = "int", amount = "decimal", at = "datetime"}
delimiter = ";"
[pipelines.ingest.schedule]
mode = "cron"
expression = "0 2 * * *"
timezone = "Europe/Berlin"
[pipelines.ingest.dead_letters]
max_per_run = 7
sink = {type = "jsonl", path = "rejects.jsonl"}
[pipelines.ingest.tracing]
enabled = true
service_name = "ingest"
exporter = "console"
[[pipelines.ingest.sinks]]
type = "database"
database_url = "${DATABASE_URL}"
table = "public.events"
columns = ["id", "amount"]
mode = "insert"
[[pipelines.ingest.sinks]]
type = "jsonl"
path = "copy.jsonl"

[pipelines.backfill.source]
type = "sql"
query = "SELECT * FROM old_events"
database_url = "${DATABASE_URL}"
key = "id"
[pipelines.backfill.schedule]
mode = "once"
[[pipelines.backfill.sinks]]
type = "stdout"

[pipelines.consumer.source]
type = "iterable"
records = []
[pipelines.consumer.schedule]
mode = "continuous"
[[pipelines.consumer.sinks]]
type = "stdout"
"""

ENV = {"DATABASE_URL": "postgresql://u@h/db"}


def test_the_seed_file_parses() -> None:
    config = load_config(SEED, {})
    assert config.health_port == 8080 and config.graceful_shutdown_timeout == 30.0
    orders = config.pipelines["orders"]
    assert (orders.id, orders.source.type, orders.source.options["records"]) == ("orders", "iterable", [{"id": 1}])
    assert orders.schedule == Schedule.every(minutes=15)
    assert [sink.type for sink in orders.sinks] == ["stdout"]
    assert orders.tracing is not None and (orders.tracing.enabled, orders.tracing.service_name) == (True, "orders-worker")
    assert (orders.max_dead_letters, orders.dead_letter_sink, orders.batch_size) == (100, None, 1000)


def test_every_option_has_a_form() -> None:
    config = load_config(FULL, ENV)
    assert (config.health_port, config.graceful_shutdown_timeout) == (0, 12.5)
    ingest = config.pipelines["ingest"]
    assert (ingest.id, ingest.batch_size, ingest.error_backoff_seconds, ingest.max_consecutive_errors) == (
        "events_ingest", 500, 30.0, 5)
    assert ingest.source.options == {"path": "events.csv", "schema": {"id": "int", "amount": "decimal", "at": "datetime"},
                                     "delimiter": ";", "encoding": "utf-8"}
    assert ingest.schedule == Schedule.cron("0 2 * * *", "Europe/Berlin")
    assert ingest.max_dead_letters == 7
    assert ingest.dead_letter_sink is not None and ingest.dead_letter_sink.options == {"path": "rejects.jsonl"}
    assert ingest.tracing is not None and ingest.tracing.exporter == "console"
    database = ingest.sinks[0]
    assert database.options == {"database_url": "postgresql://u@h/db", "table": "public.events",
                                "columns": ["id", "amount"], "mode": "insert"}
    backfill = config.pipelines["backfill"]
    assert backfill.schedule == Schedule.once() and backfill.source.options["key"] == "id"
    assert config.pipelines["consumer"].schedule == Schedule.continuous()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('minutes = 15', 'minutes = "15m"'), 'pipelines.orders.schedule.minutes: expected a positive number, got "15m"'),
        (('minutes = 15', 'minutes = -1'), "pipelines.orders.schedule.minutes: expected a positive number, got -1"),
        (('minutes = 15', 'minutes = 15\ncolour = "red"'), "pipelines.orders.schedule.colour: unknown key"),
        (('mode = "every"', 'mode = "sometimes"'), 'pipelines.orders.schedule.mode: expected one of every, cron, continuous, once, got "sometimes"'),
        (('format = "agora/v1"', 'format = "agora/v2"'), 'format: expected "agora/v1", got "agora/v2"'),
        (('health_port = 8080', 'health_port = 99999'), "worker.health_port: expected a port number (0-65535), got 99999"),
        (('health_port = 8080', 'health_port = "8080"'), 'worker.health_port: expected a whole number, got "8080"'),
        (('type = "iterable"', 'type = "kafka"'), 'pipelines.orders.source.type: expected one of iterable, csv, sql, got "kafka"'),
        (('records = [{id = 1}]', 'records = [1]'), "pipelines.orders.source.records[0]: expected a table, got 1"),
        (('type = "stdout"', 'type = "jsonl"'), "pipelines.orders.sinks[0].path: missing (expected a string)"),
        (('enabled = true', 'enabled = "yes"'), 'pipelines.orders.tracing.enabled: expected true or false, got "yes"'),
        (('backend = "opentelemetry"', 'backend = "zipkin"'), 'pipelines.orders.tracing.backend: expected "opentelemetry", got "zipkin"'),
        (('[worker]', '[workers]'), "workers: unknown key"),
        (('records = [{id = 1}]', 'records = [{id = 1}]\npath = "${NOT_SET}"'), "pipelines.orders.source.path: environment variable NOT_SET is not set"),
        (('[pipelines.orders.schedule]', '[pipelines.orders.timing]'), "pipelines.orders.schedule: missing"),
        (('minutes = 15', 'minutes = 15\n[pipelines.orders.dead_letters]\nmax_per_run = -2'), "pipelines.orders.dead_letters.max_per_run: expected a whole number >= 0, got -2"),
        (('format = "agora/v1"', 'format = "agora/v1"\n[x'), "(file): not valid TOML"),
    ],
)
def test_a_wrong_config_names_the_key_path(change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in SEED
    with pytest.raises(ConfigError) as caught:
        load_config(SEED.replace(old, new, 1), {})
    assert str(caught.value).startswith(message), str(caught.value)


def test_cron_and_csv_errors() -> None:
    bad_cron = FULL.replace('expression = "0 2 * * *"', 'expression = "every day"')
    with pytest.raises(ConfigError, match=r"^pipelines.ingest.schedule.expression: "):
        load_config(bad_cron, ENV)
    bad_type = FULL.replace('amount = "decimal"', 'amount = "money"')
    with pytest.raises(ConfigError, match=r'^pipelines.ingest.source.schema.amount: expected one of .*got "money"'):
        load_config(bad_type, ENV)
    duplicate = FULL.replace('id = "events_ingest"', 'id = "consumer"')
    with pytest.raises(ConfigError, match=r'^pipelines.(ingest|consumer).id: "consumer" is the id of another schedule'):
        load_config(duplicate, ENV)


PERIODIC = """
format = "agora/v1"
[periodic_jobs.report]
kind = "send_report"
payload = {to = "team@example.com"}
queue = "reports"
priority = 5
max_retries = 2
timeout_seconds = 60
[periodic_jobs.report.schedule]
mode = "cron"
expression = "0 8 * * 1-5"
timezone = "Europe/Berlin"
[periodic_jobs.heartbeat]
kind = "ping"
[periodic_jobs.heartbeat.schedule]
mode = "every"
minutes = 5
"""


def test_periodic_jobs_alone_make_a_config_and_build_periodic_jobs() -> None:
    from agora_pg.runner import PeriodicJob
    from agora_pg.runner.assembly import build_worker_pool

    config = load_config(PERIODIC, {})
    assert config.pipelines == {}
    report = config.periodic_jobs["report"]
    assert (report.id, report.kind, report.payload, report.queue, report.priority, report.max_retries,
            report.timeout_seconds) == ("periodic:report", "send_report", {"to": "team@example.com"}, "reports", 5, 2, 60)
    assert report.schedule == Schedule.cron("0 8 * * 1-5", "Europe/Berlin")
    heartbeat = config.periodic_jobs["heartbeat"]
    assert (heartbeat.payload, heartbeat.queue, heartbeat.max_retries) == ({}, "default", None)
    pool = build_worker_pool(config)
    assert pool.pipelines == [] and [type(p) for p in pool.periodic_jobs] == [PeriodicJob, PeriodicJob]
    assert [(p.pipeline_id, p.job_kind) for p in pool.periodic_jobs] == [("periodic:report", "send_report"),
                                                                            ("periodic:heartbeat", "ping")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('kind = "ping"', ''), "periodic_jobs.heartbeat.kind: missing (expected a string)"),
        (('kind = "ping"', 'kind = "ping"\ncolour = 1'), "periodic_jobs.heartbeat.colour: unknown key"),
        (('mode = "every"\nminutes = 5', 'mode = "continuous"'),
         'periodic_jobs.heartbeat.schedule.mode: a periodic job needs "every", "cron" or "once"'),
        (("max_retries = 2", "max_retries = -1"), "periodic_jobs.report.max_retries: expected a whole number >= 0"),
        (("timeout_seconds = 60", "timeout_seconds = 0"), "periodic_jobs.report.timeout_seconds: expected a positive number"),
        (('payload = {to = "team@example.com"}', 'payload = "to team"'), 'periodic_jobs.report.payload: expected a table'),
        (('kind = "ping"', 'kind = "ping"\nid = "periodic:report"'),
         'periodic_jobs.report.id: "periodic:report" is the id of another schedule too'),
    ],
)
def test_a_wrong_periodic_job_names_the_key_path(change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in PERIODIC
    with pytest.raises(ConfigError) as caught:
        load_config(PERIODIC.replace(old, new, 1), {})
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_config_without_pipelines_or_periodic_jobs_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^pipelines: expected at least one \[pipelines.NAME\] or \[periodic_jobs.NAME\]"):
        load_config('format = "agora/v1"\n[worker]\nhealth_port = 1\n', {})


KINDS = PERIODIC + """
[kinds.send_report]
concurrency = 2
limit_by = "customer"
rate = [100, 60]
[kinds.ping]
fair_by = "tenant"
"""


def test_kinds_tables_declare_flow_control() -> None:
    from agora_pg.limits import KindLimit
    from agora_pg.runner.assembly import build_worker_pool

    config = load_config(KINDS, {})
    assert config.kinds == {"send_report": KindLimit(2, "customer", (100, 60.0), None),
                            "ping": KindLimit(fair_by="tenant")}
    assert build_worker_pool(config).kind_limits == config.kinds
    assert load_config(PERIODIC, {}).kinds is None  # no [kinds] table: the limits are left alone
    assert load_config(PERIODIC + "[kinds]\n", {}).kinds == {}  # an empty one: the config declares none


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("concurrency = 2", "concurrency = 0"), "kinds.send_report.concurrency: expected a whole number from 1 to 1,000,000, got 0"),
        (("concurrency = 2", 'concurrency = "2"'), 'kinds.send_report.concurrency: expected a whole number, got "2"'),
        (("rate = [100, 60]", "rate = [100]"), "kinds.send_report.rate: expected (starts, seconds) with starts a whole number from 1 to 1,000,000 and seconds from 0.001 to 86,400"),
        (("rate = [100, 60]", "rate = [0, 60]"), "kinds.send_report.rate: expected (starts, seconds) with starts a whole number from 1 to 1,000,000 and seconds from 0.001 to 86,400"),
        (("rate = [100, 60]", "rate = [100, -1]"), "kinds.send_report.rate: expected (starts, seconds) with starts a whole number from 1 to 1,000,000 and seconds from 0.001 to 86,400"),
        (("rate = [100, 60]", 'rate = "100/min"'), 'kinds.send_report.rate: expected an array, got "100/min"'),
        (('fair_by = "tenant"', 'fair_by = ""'), "kinds.ping.fair_by: expected the name of a payload field"),
        (('fair_by = "tenant"', 'limit_by = "tenant"'), "kinds.ping.limit_by: 'tenant' needs a concurrency or rate limit"),
        (('fair_by = "tenant"', ''), "kinds.ping: expected at least one of concurrency, rate or fair_by"),
        (('fair_by = "tenant"', 'fair_by = "tenant"\nweight = 2'), "kinds.ping.weight: unknown key"),
        (("[kinds.ping]", '[kinds."ping\\u001b[2J"]'), 'kinds.ping\x1b[2J: expected a kind name: must not contain control'),
        (("[kinds.ping]", f'[kinds.{"p" * 1001}]'), f'kinds.{"p" * 1001}: expected a kind name: longer than 1000'),
        (("concurrency = 2", "concurrency = 2147483648"),
         "kinds.send_report.concurrency: expected a whole number from 1 to 1,000,000, got 2147483648"),
        (("rate = [100, 60]", "rate = [1, nan]"), "kinds.send_report.rate: expected (starts, seconds)"),
        (("rate = [100, 60]", "rate = [1, inf]"), "kinds.send_report.rate: expected (starts, seconds)"),
        (("rate = [100, 60]", "rate = [1, 1e300]"), "kinds.send_report.rate: expected (starts, seconds)"),
        (("rate = [100, 60]", "rate = [1, 1e12]"), "kinds.send_report.rate: expected (starts, seconds)"),
        (("rate = [100, 60]", "rate = [2147483648, 60]"), "kinds.send_report.rate: expected (starts, seconds)"),
        (('limit_by = "customer"', f'limit_by = "{"c" * 201}"'), "kinds.send_report.limit_by: expected the name of"),
    ],
)
def test_a_wrong_kinds_table_names_the_key_path(change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in KINDS
    with pytest.raises(ConfigError) as caught:
        load_config(KINDS.replace(old, new, 1), {})
    assert str(caught.value).startswith(message), str(caught.value)


QUEUES = PERIODIC + """
[queues.mail]
concurrency = 5
[queues.reports]
concurrency = 1
rate = [100, 60]
[queues.sms]
rate = [10, 1]
"""


def test_queues_tables_declare_concurrency_limits() -> None:
    from agora_pg.limits import QueueLimit
    from agora_pg.runner.assembly import build_worker_pool

    config = load_config(QUEUES, {})
    assert config.queues == {"mail": QueueLimit(5), "reports": QueueLimit(1, (100, 60.0)),
                             "sms": QueueLimit(None, (10, 1.0))}
    assert build_worker_pool(config).queue_limits == config.queues
    assert load_config(PERIODIC, {}).queues is None  # no [queues] table: the limits are left alone
    assert load_config(PERIODIC + "[queues]\n", {}).queues == {}  # an empty one: the config declares none


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("concurrency = 5", "concurrency = 0"), "queues.mail.concurrency: expected a whole number from 1 to 1,000,000, got 0"),
        (("concurrency = 5", 'concurrency = "5"'), 'queues.mail.concurrency: expected a whole number, got "5"'),
        (("concurrency = 5", ""), "queues.mail: expected at least one of concurrency or rate"),
        (("rate = [10, 1]", "rate = [10]"), "queues.sms.rate: expected (starts, seconds) with starts a whole number from 1 to 1,000,000 and seconds from 0.001 to 86,400"),
        (("rate = [10, 1]", "rate = [10, 0]"), "queues.sms.rate: expected (starts, seconds) with starts a whole number from 1 to 1,000,000 and seconds from 0.001 to 86,400"),
        (("concurrency = 5", "concurrency = 5\nlimit_by = \"x\""), "queues.mail.limit_by: unknown key"),
        (("[queues.mail]", '[queues."mail\\u001b[2J"]'), "queues.mail\x1b[2J: expected a queue name: must not contain"),
        (("[queues.mail]", f'[queues.{"m" * 10_000}]'), f"queues.{'m' * 10_000}: expected a queue name: longer than 100"),
        (("[queues.mail]", '[queues."agora:pipelines"]'), "queues.agora:pipelines: expected a queue name: queue names "
                                                          "beginning 'agora:' are agora-pg's own"),
        (("rate = [10, 1]", "rate = [1, nan]"), "queues.sms.rate: expected (starts, seconds)"),
        (("rate = [10, 1]", "rate = [1, inf]"), "queues.sms.rate: expected (starts, seconds)"),
        (("concurrency = 5", "concurrency = 2147483648"), "queues.mail.concurrency: expected a whole number from 1"),
    ],
)
def test_a_wrong_queues_table_names_the_key_path(change: tuple[str, str], message: str) -> None:
    old, new = change
    assert old in QUEUES
    with pytest.raises(ConfigError) as caught:
        load_config(QUEUES.replace(old, new, 1), {})
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_broken_file_is_named_by_its_path(tmp_path: Path) -> None:
    from agora_pg.runner.assembly import read_config

    broken = tmp_path / "pipelines.toml"
    broken.write_text('format = "agora/v1"\n[x', encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(broken))}: not valid TOML: Expected"):
        read_config(str(broken))
