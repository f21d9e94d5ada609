"""The ``agora-pg`` command line: the edge where asyncio.run lives."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agora_pg.errors import AgoraError, ConfigError, InvalidArgument
from agora_pg.logs import FORMATS, LEVELS, configure_logging
from agora_pg.printable import escape_controls
from agora_pg.settings import load_settings, parse_queues

# Each command imports what it runs when it runs (a worker process loads neither the
# API's server nor Alembic; an operator command not the worker): starting a process
# is most of what a short command costs, and CI starts hundreds.
if TYPE_CHECKING:
    from agora_pg.config import WorkerConfig

log = logging.getLogger("agora_pg")

EXIT_ERROR = 1
EXIT_USAGE = 2


def package_version() -> str:
    try:
        return importlib.metadata.version("agora-pg")
    except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    # --log-level and --log-format go before or after the command (agora-pg worker --log-level DEBUG)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=argparse.SUPPRESS, type=str.upper, choices=LEVELS,
                        help="DEBUG, INFO, WARNING or ERROR [AGORA_PG_LOG_LEVEL, else INFO]")
    common.add_argument("--log-format", default=argparse.SUPPRESS, choices=FORMATS,
                        help="text, or json: one JSON object per line [AGORA_PG_LOG_FORMAT, else text]")
    parser = argparse.ArgumentParser(
        prog="agora-pg", description="Durable Postgres job queue.", parents=[common],
        epilog="example:\n  agora-pg migrate && agora-pg worker --module worker --concurrency 50\n\n"
               "agora-pg COMMAND --help shows a command's options and an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(group: Any, name: str, summary: str, example: str) -> argparse.ArgumentParser:
        """A (sub)command whose --help ends with an example."""
        return cast(argparse.ArgumentParser, group.add_parser(
            name, parents=[common], help=summary, description=summary[:1].upper() + summary[1:] + ".",
            epilog=f"example:\n  {example}", formatter_class=argparse.RawDescriptionHelpFormatter,
        ))

    command(commands, "migrate", "apply the database migrations (idempotent)",
            "AGORA_PG_DATABASE_URL=postgresql://app@db/app agora-pg migrate")
    prune = command(commands, "prune", "delete finished history older than an age, in small batches",
                    "agora-pg prune --older-than 30d --keep-failed 90d")
    prune.add_argument("--older-than", required=True,
                       help="delete done and cancelled jobs (with their runs), pipeline runs and replayed dead "
                            "letters that ended longer ago than this (30d, 12h, 2w)")
    prune.add_argument("--keep-failed", help="keep jobs that failed for good this long instead [--older-than]")
    prune.add_argument("--batch-size", type=int, default=1000, help="rows per delete (each its own transaction) [1000]")

    worker = command(commands, "worker", "run a worker module's get_worker()",
                     "agora-pg worker --module myproject.worker --queues default,mail --concurrency 50")
    worker.add_argument("--module", default=None, help="dotted module path [worker]")
    worker.add_argument("--config", help="an agora/v1 TOML file: a worker built from config alone")
    worker.add_argument("--queues", help="comma-separated queues (overrides WORKER_QUEUES)")
    worker.add_argument("--concurrency", type=int, help="jobs run at once (overrides WORKER_CONCURRENCY)")
    worker.add_argument("--health-port", type=int, help="serve /health, /ready and /metrics on this port (0: any free port)")
    worker.add_argument("--health-host", help="the health server's address (overrides WORKER_HEALTH_HOST) [127.0.0.1]")

    api = command(commands, "api", "serve the REST API with uvicorn",
                  "AGORA_PG_API_TOKEN=s3cret agora-pg api --host 0.0.0.0 --port 8000 --module worker")
    api.add_argument("--host", default="127.0.0.1", help="address to bind [127.0.0.1]")
    api.add_argument("--port", type=int, default=8000, help="port [8000]")
    api.add_argument("--insecure", action="store_true", help="allow a non-loopback address without AGORA_PG_API_TOKEN")
    api.add_argument("--module", help="a worker module whose kinds POST /jobs applies (payload types, queues, "
                                      "max_retries) [none]")

    dev = command(commands, "dev", "embedded Postgres, migrations, the API and a worker, until Ctrl+C",
                  "agora-pg dev --module worker --port 8000")
    dev.add_argument("--host", default="127.0.0.1", help="API address [127.0.0.1]")
    dev.add_argument("--port", type=int, default=8000, help="API port [8000]")
    dev.add_argument("--module", default="worker", help="the worker module [worker]")
    dev.add_argument("--health-port", type=int, help="the worker's health port (overrides the module's)")

    jobs = command(commands, "jobs", "submit, list, show, retry or cancel jobs", "agora-pg jobs list --status failed"
                   ).add_subparsers(dest="action", required=True, metavar="ACTION")
    submit = command(jobs, "submit", "enqueue one job",
                     """agora-pg jobs submit send_email --payload '{"to": "a@b.c"}' --queue mail --dedup-key welcome:42""")
    submit.add_argument("kind", help="the job's kind: which handler runs it")
    submit.add_argument("--payload", default="{}", help="a JSON object [{}]")
    submit.add_argument("--queue", help="the queue [the one its workers declared for the kind, else default]")
    submit.add_argument("--priority", type=int, default=0, help="higher runs first [0]")
    submit.add_argument("--run-at", help="ISO 8601 time with offset, e.g. 2026-01-01T09:00:00+00:00 [now]")
    submit.add_argument("--max-retries", type=int, help="failed attempts retried [the kind's, else WORKER_MAX_RETRIES]")
    submit.add_argument("--dedup-key", help="while a job with this key is pending, running or waiting for a "
                                            "retry, return it instead of adding one")
    submit.add_argument("--name", help="a label [the kind]")
    submit.add_argument("--timeout", type=float, help="seconds an attempt may run [the kind's, else WORKER_JOB_TIMEOUT]")
    listing = command(jobs, "list", "jobs newest first", "agora-pg jobs list --status failed --kind send_email --limit 50")
    listing.add_argument("--status", help="pending, processing, done, failed or cancelled")
    listing.add_argument("--kind", help="only jobs of this kind")
    listing.add_argument("--queue", help="only jobs of this queue")
    listing.add_argument("--limit", type=int, default=20, help="jobs shown [20]")
    for action in ("show", "retry", "cancel"):
        command(jobs, action, f"{action} one job", f"agora-pg jobs {action} 42").add_argument(
            "job_id", type=int, help="the job's id")

    schedules = command(commands, "schedules", "list, show, pause, resume, trigger or delete schedules",
                        "agora-pg schedules pause nightly-report").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    command(schedules, "list", "every schedule, by pipeline id", "agora-pg schedules list")
    for action, what in (("show", "one schedule"), ("pause", "no new run until resumed"),
                         ("resume", "a paused schedule, or one stopped after errors (due now)"),
                         ("trigger", "run an active, idle schedule now, once"),
                         ("delete", "remove a schedule and its future ticks (its history stays)")):
        command(schedules, action, what, f"agora-pg schedules {action} nightly-report").add_argument(
            "pipeline_id", help="the scheduled pipeline's id")

    family = command(commands, "family", "job families", "agora-pg family new demo_notice"
                     ).add_subparsers(dest="action", required=True, metavar="ACTION")
    family_new = command(family, "new", "write a new job family from the template, with its tests",
                         "agora-pg family new demo_notice && python -m pytest tests/unit/test_demo_notice_pipeline.py")
    family_new.add_argument("name", help="the family's name: its package under families/ and its job kind")
    family_new.add_argument("--path", default=".", help="the project's directory [.]")

    run = command(commands, "run", "run the pipelines of an agora/v1 config once, then exit",
                  "agora-pg run --config pipelines.toml --pipeline orders-csv")
    run.add_argument("--config", required=True, help="the agora/v1 TOML file")
    run.add_argument("--pipeline", help="only this pipeline (its name or id)")

    dlq = command(commands, "dlq", "dead letters of pipelines", "agora-pg dlq list --pipeline orders-csv"
                  ).add_subparsers(dest="action", required=True, metavar="ACTION")
    dlq_list = command(dlq, "list", "dead letters newest first (waiting for replay unless --all)",
                       "agora-pg dlq list --pipeline orders-csv --all")
    dlq_list.add_argument("--pipeline", help="a pipeline id")
    dlq_list.add_argument("--all", action="store_true", help="include replayed ones")
    dlq_list.add_argument("--limit", type=int, default=20, help="dead letters shown [20]")
    replay = command(dlq, "replay", "send waiting dead letters through the pipeline again",
                     "agora-pg dlq replay --config pipelines.toml --pipeline orders-csv")
    replay.add_argument("--config", required=True, help="the agora/v1 TOML file that defines the pipeline")
    replay.add_argument("--pipeline", required=True, help="the pipeline (its name or id)")
    replay.add_argument("--limit", type=int, default=1000, help="dead letters replayed at most [1000]")

    runs = command(commands, "runs", "run history", "agora-pg runs list --status failed --traceback"
                   ).add_subparsers(dest="action", required=True, metavar="ACTION")
    run_list = command(runs, "list", "runs newest first",
                       "agora-pg runs list --pipeline-id nightly-report --since 2026-01-01T00:00:00+00:00")
    run_list.add_argument("--pipeline-id", help="only runs of this scheduled pipeline")
    run_list.add_argument("--job-id", type=int, help="only the attempts of this job")
    run_list.add_argument("--status", help="running, succeeded, failed, abandoned or cancelled")
    run_list.add_argument("--since", help="runs started at or after this ISO 8601 time")
    run_list.add_argument("--until", help="runs started before this ISO 8601 time")
    run_list.add_argument("--limit", type=int, default=20, help="runs shown [20]")
    run_list.add_argument("--traceback", action="store_true", help="print each failed run's traceback below the table")
    return parser


async def run_operator(args: argparse.Namespace) -> None:
    """``agora-pg jobs ...``, ``agora-pg schedules ...``, ``agora-pg runs list`` and
    ``agora-pg prune``: print a table or a line."""
    from agora_pg.commands import operator

    if args.command == "prune":
        text = await operator.prune(args.older_than, args.keep_failed, args.batch_size)
    elif args.command == "schedules":
        text = (await operator.list_schedules() if args.action == "list"
                else await operator.change_schedule(args.action, args.pipeline_id))
    elif args.command == "runs":
        text = await operator.list_runs(args.pipeline_id, args.job_id, args.status, args.since, args.until, args.limit,
                                        args.traceback)
    elif args.action == "submit":
        text = await operator.submit(args.kind, args.payload, args.queue, args.priority, args.run_at,
                                     args.max_retries, args.dedup_key, args.name, args.timeout)
    elif args.action == "list":
        text = await operator.list_jobs(args.status, args.kind, args.queue, args.limit)
    else:
        action = {"show": operator.show_job, "retry": operator.retry_job, "cancel": operator.cancel_job}[args.action]
        text = await action(args.job_id)
    print(escape_controls(text))  # (queue names, kinds, errors and payloads come from outside)


async def run_migrate(*, implicit: bool = False) -> None:
    """Apply the migrations and say what was applied (before another command on the
    embedded server, ``implicit``: quiet unless something was)."""
    from agora_pg.db import migrate as migrations
    from agora_pg.db.connect import resolve_database
    from agora_pg.db.store import Store

    settings = load_settings(os.environ)
    async with resolve_database(settings) as database:
        store = Store.open(database, pool_size=1)
        try:
            before = await store.schema_versions()
            await migrations.upgrade(store)
            after = await store.schema_versions()
        finally:
            await store.close()
    now_at = ", ".join(sorted(after))
    if before != after:
        applied = migrations.revisions_between(before, after)
        log.info("applied migration(s) %s to %s: now at revision %s", ", ".join(applied), database.display_url,
                 now_at)
    else:
        log.log(logging.DEBUG if implicit else logging.INFO,
                "database %s is at revision %s: nothing to apply", database.display_url, now_at)


async def run_worker(module: str | None, config: WorkerConfig | None, queues: str | None, concurrency: int | None,
                     health_port: int | None, health_host: str | None = None) -> None:
    from agora_pg.loading import load_worker
    from agora_pg.runner import WorkerPool
    from agora_pg.runner.assembly import build_worker_pool
    from agora_pg.runtime.process import tune_garbage_collector
    from agora_pg.worker import Worker

    if module is not None and config is not None:
        raise ConfigError("--config", "give --module or --config, not both")
    loaded = build_worker_pool(config) if config is not None else load_worker(module or "worker", Path.cwd())
    if concurrency is not None and concurrency < 1:
        raise ConfigError("--concurrency", f"must be >= 1, got {concurrency}")
    if health_port is not None and not 0 <= health_port <= 65535:
        raise ConfigError("--health-port", f"must be a port number, got {health_port}")
    if isinstance(loaded, Worker):
        pool = WorkerPool(graceful_shutdown_timeout=loaded.effective_settings().shutdown_timeout).register(loaded)
    else:
        pool = loaded
    if pool.job_worker is not None:
        pool.job_worker.configure(
            queues=parse_queues(queues, key="--queues") if queues is not None else None,
            concurrency=concurrency,
        )
    elif queues is not None or concurrency is not None:
        raise ConfigError("--queues/--concurrency", f"{'the config' if config else module or 'worker'} registers no job Worker")
    if health_port is not None:  # over the module's, and over WORKER_HEALTH_PORT (which the pool reads too)
        pool.health_port = health_port
        os.environ["WORKER_HEALTH_PORT"] = str(health_port)
    if health_host is not None:  # (the pool reads WORKER_HEALTH_HOST at run)
        os.environ["WORKER_HEALTH_HOST"] = health_host
    tune_garbage_collector()
    await pool.run()


async def run_dlq(args: argparse.Namespace, config: WorkerConfig | None) -> None:
    from agora_pg.commands import pipelines as pipeline_commands

    if args.action == "list":
        print(escape_controls(await pipeline_commands.list_dead_letters(args.pipeline, args.all, args.limit)))
    else:
        assert config is not None  # --config is required for replay
        print(escape_controls(await pipeline_commands.replay_dead_letters(config, args.pipeline, args.limit)))


def new_family_text(name: str, project: Path) -> str:
    """``agora-pg family new``: write the family, then say what was written and what next."""
    from agora_pg.families.scaffold import new_family

    written = new_family(name, project)
    files = "\n".join(f"  {path.relative_to(project)}" for path in written)
    serial = " -n0" if importlib.util.find_spec("xdist") else ""  # (xdist's workers take longer to start than these run)
    return (f"wrote family {name}:\n{files}\n"
            f"next: run its tests (python -m pytest{serial} tests/unit/test_{name}_pipeline.py), replace its stages, give "
            f"the services of your composition root a {name}_svc, and import families.{name}.impl in worker.py "
            f"(its handler is then in FAMILIES.handlers())")


def run_event_loop(main_coroutine: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop when it is installed (the ``fast`` extra): the worker's hot path is
    socket I/O and task switching, which uvloop does in C. Plain asyncio otherwise (run
    outside the ``except``: every error would carry the ImportError as its context)."""
    run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    with contextlib.suppress(ImportError):
        from uvloop import run
    run(main_coroutine)


# Commands that use the database through the schema; on the embedded server (no
# database URL: a development machine) they apply the migrations first themselves.
SCHEMA_COMMANDS = {"worker", "run", "dlq", "api", "jobs", "runs", "schedules", "prune"}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", None) or os.environ.get("AGORA_PG_LOG_LEVEL", "INFO").upper()
    log_format = getattr(args, "log_format", None) or os.environ.get("AGORA_PG_LOG_FORMAT", "text").lower()
    if level not in LEVELS:
        print(f"agora-pg: AGORA_PG_LOG_LEVEL: expected {', '.join(LEVELS)}, got {level!r}", file=sys.stderr)
        return EXIT_USAGE
    if log_format not in FORMATS:
        print(f"agora-pg: AGORA_PG_LOG_FORMAT: expected text or json, got {log_format!r}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(level, log_format)
    args.log_level = level
    from agora_pg.runtime.process import warn_unknown_settings

    warn_unknown_settings()
    try:
        config = None
        if getattr(args, "config", None):  # read and checked first: a wrong one fails before anything starts
            from agora_pg.runner.assembly import read_config

            config = read_config(args.config)
        if args.command in ("api", "dev"):  # a busy port is said before a server starts
            from agora_pg.commands import serve

            serve.check_port_free("--port", args.host, args.port)
        if args.command in SCHEMA_COMMANDS and load_settings(os.environ).database_url is None:
            asyncio.run(run_migrate(implicit=True))
        if args.command == "migrate":
            asyncio.run(run_migrate())
        elif args.command == "worker":
            run_event_loop(run_worker(args.module, config, args.queues, args.concurrency, args.health_port,
                                        args.health_host))
        elif args.command == "run":
            from agora_pg.commands import pipelines as pipeline_commands

            assert config is not None  # --config is required
            asyncio.run(pipeline_commands.run_once(config, args.pipeline))
        elif args.command == "dlq":
            asyncio.run(run_dlq(args, config))
        elif args.command == "api":
            run_event_loop(serve.run_api(args.host, args.port, args.insecure, args.log_level, args.module))
        elif args.command == "family":
            print(new_family_text(args.name, Path(args.path)))
        elif args.command == "dev":
            asyncio.run(serve.run_dev(args.host, args.port, args.module, args.health_port, args.log_level))
        else:
            asyncio.run(run_operator(args))
    except (ConfigError, InvalidArgument) as error:  # (InvalidJob is one)
        print(f"agora-pg: {escape_controls(str(error))}", file=sys.stderr)
        return EXIT_USAGE
    except AgoraError as error:
        print(f"agora-pg: {escape_controls(str(error))}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
