"""The ``agora/v1`` config file: pure, strict parsing into plain values.

``load_config(text, env)`` parses TOML text; every value is checked, unknown keys are
errors, and ``${NAME}`` in a string is replaced by the environment variable NAME.
A problem raises ``ConfigError`` naming the key path, e.g.
``pipelines.orders.schedule.minutes: expected a positive number, got "15m"``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agora_pg.errors import ConfigError, InvalidJob, InvalidSchedule
from agora_pg.job_spec import JobSpec, refuse_reserved_queue
from agora_pg.limits import InvalidLimit, KindLimit, QueueLimit
from agora_pg.schedules import Schedule

FORMAT = "agora/v1"
TYPE_NAMES = ("str", "int", "float", "decimal", "bool", "date", "datetime", "json")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclasses.dataclass(frozen=True)
class Component:
    """A source or sink: its ``type`` and its checked options."""

    type: str
    options: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class TracingConfig:
    enabled: bool
    service_name: str
    exporter: str
    endpoint: str | None


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    name: str
    id: str
    source: Component
    sinks: list[Component]
    schedule: Schedule
    batch_size: int
    error_backoff_seconds: float
    max_consecutive_errors: int
    max_dead_letters: int
    dead_letter_sink: Component | None
    tracing: TracingConfig | None


@dataclasses.dataclass(frozen=True)
class PeriodicJobConfig:
    """A ``[periodic_jobs.NAME]`` table: the job a ``PeriodicJob`` enqueues on each tick."""

    name: str
    id: str
    kind: str
    payload: dict[str, Any]
    queue: str
    priority: int
    max_retries: int | None
    timeout_seconds: float | None
    schedule: Schedule
    error_backoff_seconds: float
    max_consecutive_errors: int


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    health_port: int | None
    graceful_shutdown_timeout: float
    pipelines: dict[str, PipelineConfig]
    periodic_jobs: dict[str, PeriodicJobConfig] = dataclasses.field(default_factory=dict)
    # [kinds.NAME]: the flow control of job kinds, declared by the config worker (it wins
    # over the code's; None: the file has no [kinds] table and leaves limits alone)
    kinds: dict[str, KindLimit] | None = None
    # [queues.NAME]: limits of queues (the same rules; None: no [queues] table)
    queues: dict[str, QueueLimit] | None = None


def load_config(text: str, env: Mapping[str, str], source: str = "(file)") -> WorkerConfig:
    """Parse an ``agora/v1`` TOML document (``source``: its file, named in a TOML error)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(source, f"not valid TOML: {error}") from None
    root = _Table(_substitute(document, "", env), "")
    document_format = root.required("format", str)
    if document_format != FORMAT:
        raise ConfigError("format", f'expected "{FORMAT}", got {_show(document_format)}')
    worker = root.table("worker")
    health_port = worker.optional("health_port", int)
    if health_port is not None and not 0 <= health_port <= 65535:
        raise ConfigError(worker.key("health_port"), f"expected a port number (0-65535), got {health_port}")
    shutdown = worker.number("graceful_shutdown_timeout", 30.0, minimum=0.0)
    worker.done()
    pipelines_table = root.table("pipelines")
    periodic_table = root.table("periodic_jobs")
    if not pipelines_table.data and not periodic_table.data:
        raise ConfigError("pipelines", "expected at least one [pipelines.NAME] or [periodic_jobs.NAME] table")
    pipelines = {name: _pipeline(pipelines_table.table(name), name) for name in list(pipelines_table.data)}
    pipelines_table.done()
    periodic_jobs = {name: _periodic_job(periodic_table.table(name), name) for name in list(periodic_table.data)}
    periodic_table.done()
    has_kinds = "kinds" in root.data
    kinds_table = root.table("kinds")
    kinds = {name: _kind_limit(kinds_table.table(name), name) for name in list(kinds_table.data)} if has_kinds else None
    kinds_table.done()
    has_queues = "queues" in root.data
    queues_table = root.table("queues")
    queues = ({name: _queue_limit(queues_table.table(name), name) for name in list(queues_table.data)}
              if has_queues else None)
    queues_table.done()
    ids = [(f"pipelines.{name}", item.id) for name, item in pipelines.items()]
    ids += [(f"periodic_jobs.{name}", item.id) for name, item in periodic_jobs.items()]
    for path, schedule_id in ids:
        if [other for other in ids if other[1] == schedule_id][1:]:
            raise ConfigError(f"{path}.id", f"{_show(schedule_id)} is the id of another schedule too")
    root.done()
    return WorkerConfig(health_port, shutdown, pipelines, periodic_jobs, kinds, queues)


def _queue_limit(table: _Table, name: str) -> QueueLimit:
    """A ``[queues.NAME]`` table: ``concurrency`` and ``rate = [starts, seconds]``, as
    ``handlers.queue(...)`` takes them."""
    _checked(table, lambda: refuse_reserved_queue(JobSpec("kind", queue=name)))
    limit = _checked(table, lambda: QueueLimit(table.optional("concurrency", int), table.optional("rate", list)))
    if limit == QueueLimit():
        raise ConfigError(table.path, "expected at least one of concurrency or rate")
    table.done()
    return limit


def _kind_limit(table: _Table, name: str) -> KindLimit:
    """A ``[kinds.NAME]`` table: ``concurrency``, ``limit_by``, ``rate = [starts, seconds]``
    and ``fair_by``, as ``handlers.kind(...)`` takes them."""
    _checked(table, lambda: JobSpec(name))
    limit = _checked(table, lambda: KindLimit(table.optional("concurrency", int), table.optional("limit_by", str),
                                              table.optional("rate", list), table.optional("fair_by", str)))
    if limit == KindLimit():
        raise ConfigError(table.path, "expected at least one of concurrency, rate or fair_by")
    table.done()
    return limit


_T = TypeVar("_T")


def _checked(table: _Table, build: Callable[[], _T]) -> _T:
    """``build()``: a job's rule it breaks (the table's name) as an error at the table, a
    limit's bound (limits.py) at the limit's key."""
    try:
        return build()
    except InvalidJob as error:
        raise ConfigError(table.path, f"expected a {error.field} name: {error.problem}") from None
    except InvalidLimit as error:
        raise ConfigError(table.key(error.field), error.reason) from None


def _periodic_job(table: _Table, name: str) -> PeriodicJobConfig:
    kind = table.required("kind", str)
    if not kind.strip():
        raise ConfigError(table.key("kind"), "expected a job kind, got an empty string")
    max_retries = table.optional("max_retries", int)
    if max_retries is not None and max_retries < 0:
        raise ConfigError(table.key("max_retries"), f"expected a whole number >= 0, got {max_retries}")
    timeout = table.positive("timeout_seconds") if "timeout_seconds" in table.data else None
    table._known.append("timeout_seconds")
    schedule = _schedule(table.table("schedule", required=True))
    if schedule.kind.value == "continuous":
        raise ConfigError(table.key("schedule.mode"), 'a periodic job needs "every", "cron" or "once"')
    config = PeriodicJobConfig(
        name=name,
        id=table.optional("id", str) or f"periodic:{name}",
        kind=kind,
        payload=table.optional("payload", dict) or {},
        queue=table.optional("queue", str) or "default",
        priority=table.number("priority", 0, minimum=-(2**31), kind=int),
        max_retries=max_retries,
        timeout_seconds=timeout,
        schedule=schedule,
        error_backoff_seconds=table.number("error_backoff_seconds", 60.0, minimum=0.0),
        max_consecutive_errors=table.number("max_consecutive_errors", 10, minimum=1, kind=int),
    )
    table.done()
    return config


def _pipeline(table: _Table, name: str) -> PipelineConfig:
    pipeline_id = table.optional("id", str) or name
    source = _source(table.table("source", required=True))
    sinks_value = table.data.pop("sinks", None)
    if not isinstance(sinks_value, list) or not sinks_value:
        raise ConfigError(table.key("sinks"), "expected at least one [[pipelines.NAME.sinks]] table")
    sinks = [_sink(_Table(item, table.key(f"sinks[{i}]"))) for i, item in enumerate(sinks_value)]
    schedule = _schedule(table.table("schedule", required=True))
    dead = table.table("dead_letters")
    max_dead = dead.number("max_per_run", 100, minimum=0, kind=int)
    dead_sink = _sink(dead.table("sink")) if "sink" in dead.data else None
    dead.done()
    tracing = _tracing(table.table("tracing")) if "tracing" in table.data else None
    config = PipelineConfig(
        name=name,
        id=pipeline_id,
        source=source,
        sinks=sinks,
        schedule=schedule,
        batch_size=table.number("batch_size", 1000, minimum=1, kind=int),
        error_backoff_seconds=table.number("error_backoff_seconds", 60.0, minimum=0.0),
        max_consecutive_errors=table.number("max_consecutive_errors", 10, minimum=1, kind=int),
        max_dead_letters=max_dead,
        dead_letter_sink=dead_sink,
        tracing=tracing,
    )
    table.done()
    return config


def _source(table: _Table) -> Component:
    kind = table.choice("type", ("iterable", "csv", "sql"))
    options: dict[str, Any] = {}
    if kind == "iterable":
        records = table.required("records", list)
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                raise ConfigError(table.key(f"records[{i}]"), f"expected a table, got {_show(record)}")
        options["records"] = records
    elif kind == "csv":
        options["path"] = table.required("path", str)
        schema = table.optional("schema", dict) or {}
        for column, type_name in schema.items():
            if type_name not in TYPE_NAMES:
                raise ConfigError(table.key(f"schema.{column}"),
                                  f"expected one of {', '.join(TYPE_NAMES)}, got {_show(type_name)}")
        options["schema"] = schema
        delimiter = table.optional("delimiter", str) or ","
        if len(delimiter) != 1:
            raise ConfigError(table.key("delimiter"), f"expected one character, got {_show(delimiter)}")
        options["delimiter"] = delimiter
        options["encoding"] = table.optional("encoding", str) or "utf-8"
    else:
        options["query"] = table.required("query", str)
        options["database_url"] = table.required("database_url", str)
        options["key"] = table.optional("key", str)
    table.done()
    return Component(kind, options)


def _sink(table: _Table) -> Component:
    kind = table.choice("type", ("stdout", "jsonl", "database"))
    options: dict[str, Any] = {}
    if kind == "jsonl":
        options["path"] = table.required("path", str)
    elif kind == "database":
        options["database_url"] = table.required("database_url", str)
        options["table"] = table.required("table", str)
        columns = table.optional("columns", list)
        if columns is not None and not all(isinstance(column, str) for column in columns):
            raise ConfigError(table.key("columns"), f"expected a list of column names, got {_show(columns)}")
        options["columns"] = columns
        options["mode"] = table.optional("mode", str) or "copy"
        if options["mode"] not in ("copy", "insert"):
            raise ConfigError(table.key("mode"), f'expected "copy" or "insert", got {_show(options["mode"])}')
    table.done()
    return Component(kind, options)


def _schedule(table: _Table) -> Schedule:
    mode = table.choice("mode", ("every", "cron", "continuous", "once"))
    if mode == "every":
        units = ("seconds", "minutes", "hours", "days")
        amounts = {unit: table.positive(unit) for unit in units if unit in table.data}
        table._known.extend(units)
        if not amounts:
            raise ConfigError(table.key("mode"), "every needs seconds, minutes, hours or days")
        schedule = Schedule.every(**amounts)
    elif mode == "cron":
        expression = table.required("expression", str)
        timezone = table.optional("timezone", str) or "UTC"
        try:
            schedule = Schedule.cron(expression, timezone)
        except InvalidSchedule as error:
            raise ConfigError(table.key("expression"), str(error)) from None
    elif mode == "continuous":
        schedule = Schedule.continuous()
    else:
        key = table.optional("key", str)
        try:
            schedule = Schedule.once(key)
        except InvalidSchedule as error:
            raise ConfigError(table.key("key"), str(error)) from None
    table.done()
    return schedule


def _tracing(table: _Table) -> TracingConfig:
    enabled = table.optional("enabled", bool)
    backend = table.optional("backend", str) or "opentelemetry"
    if backend != "opentelemetry":
        raise ConfigError(table.key("backend"), f'expected "opentelemetry", got {_show(backend)}')
    config = TracingConfig(
        enabled=True if enabled is None else enabled,
        service_name=table.optional("service_name", str) or "agora-pg",
        exporter=table.choice("exporter", ("none", "console", "otlp"), default="none"),
        endpoint=table.optional("endpoint", str),
    )
    table.done()
    return config


class _Table:
    """A TOML table being read: each read removes its key; ``done()`` rejects the rest."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(path or "(file)", f"expected a table, got {_show(data)}")
        self.data = dict(data)
        self.path = path
        self._known: list[str] = []

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def optional(self, name: str, kind: type) -> Any:
        self._known.append(name)
        if name not in self.data:
            return None
        value = self.data.pop(name)
        if kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise ConfigError(self.key(name), f"expected {_KIND_NAMES[kind]}, got {_show(value)}")
        return value

    def required(self, name: str, kind: type) -> Any:
        if name not in self.data:
            raise ConfigError(self.key(name), f"missing (expected {_KIND_NAMES[kind]})")
        return self.optional(name, kind)

    def choice(self, name: str, choices: tuple[str, ...], default: str | None = None) -> str:
        if default is not None and name not in self.data:
            self._known.append(name)
            return default
        value = self.required(name, str)
        if value not in choices:
            raise ConfigError(self.key(name), f"expected one of {', '.join(choices)}, got {_show(value)}")
        return str(value)

    def number(self, name: str, default: Any, *, minimum: float, kind: type = float) -> Any:
        value = self.optional(name, kind)
        if value is None:
            return default
        if value < minimum:
            shown = minimum if kind is int else format(minimum, "g")
            raise ConfigError(self.key(name), f"expected {_KIND_NAMES[kind]} >= {shown}, got {_show(value)}")
        return kind(value)

    def positive(self, name: str) -> float:
        self._known.append(name)
        value = self.data.pop(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(self.key(name), f"expected a positive number, got {_show(value)}")
        return float(value)

    def table(self, name: str, *, required: bool = False) -> _Table:
        self._known.append(name)
        if name not in self.data:
            if required:
                raise ConfigError(self.key(name), f"missing (expected a [{self.key(name)}] table)")
            return _Table({}, self.key(name))
        return _Table(self.data.pop(name), self.key(name))

    def done(self) -> None:
        for name in self.data:
            expected = f" (expected one of {', '.join(sorted(set(self._known)))})" if self._known else ""
            raise ConfigError(self.key(name), f"unknown key{expected}")


_KIND_NAMES: dict[type, str] = {
    str: "a string", int: "a whole number", float: "a number", bool: "true or false", list: "an array",
    dict: "a table",
}


def _show(value: Any) -> str:
    return json.dumps(value, default=str)


def _substitute(value: Any, path: str, env: Mapping[str, str]) -> Any:
    """Replace ``${NAME}`` in every string by the environment variable NAME."""
    if isinstance(value, str):
        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise ConfigError(path, f"environment variable {name} is not set")
            return env[name]

        return _ENV.sub(replace, value)
    if isinstance(value, dict):
        return {key: _substitute(item, f"{path}.{key}" if path else key, env) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, f"{path}[{i}]", env) for i, item in enumerate(value)]
    return value
