"""Settings read from the environment: pure, strict, nothing cached.

``load_settings(env)`` takes a mapping (usually ``os.environ``) and returns a
frozen ``Settings``; a malformed value raises ``ConfigError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from agora_pg.errors import ConfigError
from agora_pg.retention import Retention, parse_age

DEFAULT_DATA_DIR = ".agora-pg"
DEFAULT_RETENTION = Retention(finished=timedelta(days=30), failed=timedelta(days=90))
MIN_TOKEN_DISTINCT_CHARACTERS = 8
_ORIGIN = re.compile(r"https?://[^/\s:]+(:[0-9]{1,5})?")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a queue client or a worker process is configured with.

    ``load_settings(os.environ)`` reads the environment variables of ``VARIABLES``
    (the configuration reference of the docs is generated from that list).
    """

    database_url: str | None = None
    data_dir: Path | None = None  # None: the nearest .agora-pg upward (db.connect.locate_data_dir)
    poll_seconds: float = 1.0
    max_retries: int = 3
    concurrency: int = 10
    lease_seconds: float = 30.0
    queues: tuple[str, ...] = ("default",)
    notifications: bool = True
    shutdown_timeout: float = 30.0
    retry_backoff_seconds: float = 2.0
    retry_backoff_max_seconds: float = 3600.0
    job_timeout: float | None = 900.0
    max_lost_attempts: int = 3
    database_timeout: float = 30.0
    idle_transaction_timeout: float = 10.0
    claim_timeout: float = 5.0
    api_token: str | None = dataclasses.field(default=None, repr=False)
    api_max_payload_bytes: int = 1024 * 1024
    api_allowed_origins: tuple[str, ...] = ()
    api_max_connections: int = 1000
    api_max_event_streams: int = 100
    api_max_connections_per_client: int = 100
    api_read_timeout: float = 10.0
    api_keep_alive_seconds: int = 5
    api_refuse_unknown_kinds: bool = False
    health_port: int | None = None
    health_host: str | None = None
    health_error_details: bool = False
    retention: Retention | None = DEFAULT_RETENTION
    prune_interval: float = 600.0
    transaction_pooling: bool = False
    listen_database_url: str | None = None
    pipelines_config: Path | None = None

    def __post_init__(self) -> None:
        for variable in VARIABLES:  # (the plain ones' bounds)
            if variable.field is not None and variable.bound is not None:
                operator, number = variable.bound.split()
                value = getattr(self, variable.field)
                _require(value > float(number) if operator == ">" else value >= float(number), variable.names[0],
                         f"must be {variable.bound}")
        _require(self.job_timeout is None or self.job_timeout > 0, "WORKER_JOB_TIMEOUT", "must be > 0 (0 for none)")
        _require(self.health_port is None or 0 <= self.health_port <= 65535, "WORKER_HEALTH_PORT",
                 "must be a port number (0: any free port)")
        _require(self.api_token is None or len(self.api_token) >= 16, "AGORA_PG_API_TOKEN",
                 "must be at least 16 characters")
        _require(self.api_token is None or self.api_token == self.api_token.strip(), "AGORA_PG_API_TOKEN",
                 "has leading or trailing spaces, which no client would send: remove them")
        _require(self.api_token is None or len(set(self.api_token)) >= MIN_TOKEN_DISTINCT_CHARACTERS,
                 "AGORA_PG_API_TOKEN", f"has fewer than {MIN_TOKEN_DISTINCT_CHARACTERS} different characters: "
                 "use a random one (openssl rand -hex 24)")
        for origin in self.api_allowed_origins:
            _require(_ORIGIN.fullmatch(origin) is not None, "AGORA_PG_API_ALLOWED_ORIGINS",
                     f"expected origins such as http://localhost:3000 (scheme://host[:port], no path), got {origin!r}")
        _require(bool(self.queues), "WORKER_QUEUES", "must name at least one queue")
        for queue in self.queues:
            _require(bool(queue) and queue == queue.strip(), "WORKER_QUEUES", f"bad queue name {queue!r}")

    def replace(self, **changes: object) -> Settings:
        """Return a copy with some fields changed (and validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


def load_settings(env: Mapping[str, str]) -> Settings:
    """Build ``Settings`` from environment variables; see ``Settings`` for the names."""
    url = env.get("AGORA_PG_DATABASE_URL") or env.get("DATABASE_URL") or None
    defaults = Settings()
    pooling = _bool(env, "AGORA_PG_TRANSACTION_POOLING", False)
    listen_url = env.get("AGORA_PG_LISTEN_DATABASE_URL") or None
    # LISTEN needs a session of its own: through a transaction pooler, only with a listen URL
    notifications_default = defaults.notifications and not (pooling and listen_url is None)
    if pooling and listen_url is None and _bool(env, "WORKER_NOTIFICATIONS", False):
        raise ConfigError("WORKER_NOTIFICATIONS", "LISTEN does not work through a transaction pooler: set "
                          "AGORA_PG_LISTEN_DATABASE_URL to the server (or a session-mode pool), or "
                          "WORKER_NOTIFICATIONS=off")
    plain = {variable.field: variable.read(env, variable.names[0], getattr(defaults, variable.field))
             for variable in VARIABLES if variable.field is not None and variable.read is not None}
    return Settings(
        **plain,
        database_url=url,
        data_dir=Path(data_dir) if (data_dir := env.get("AGORA_PG_DATA_DIR")) else None,
        queues=parse_queues(env.get("WORKER_QUEUES", "default"), key="WORKER_QUEUES"),
        notifications=_bool(env, "WORKER_NOTIFICATIONS", notifications_default),
        job_timeout=_float(env, "WORKER_JOB_TIMEOUT", defaults.job_timeout or 0.0) or None,
        api_token=env.get("AGORA_PG_API_TOKEN") or None,
        api_allowed_origins=tuple(part.strip() for part in env.get("AGORA_PG_API_ALLOWED_ORIGINS", "").split(",")
                                  if part.strip()),
        health_port=_int(env, "WORKER_HEALTH_PORT", -1) if env.get("WORKER_HEALTH_PORT", "").strip() else None,
        health_host=env.get("WORKER_HEALTH_HOST", "").strip() or None,
        retention=_retention(env),
        transaction_pooling=pooling,
        listen_database_url=listen_url,
        pipelines_config=Path(env["AGORA_PG_PIPELINES_CONFIG"]) if env.get("AGORA_PG_PIPELINES_CONFIG") else None,
    )


@dataclasses.dataclass(frozen=True)
class Variable:
    """An environment variable agora-pg reads: its names (the first wins), its default in
    words, and what it does; for a plain one, the ``Settings`` field it sets and how it is
    read (``_float``, ``_int``, ``_bool``; the field's default when unset) and bounded."""

    names: tuple[str, ...]
    default: str
    meaning: str
    field: str | None = None
    read: Callable[[Mapping[str, str], str, Any], Any] | None = None
    bound: str | None = None  # what the value must be: "> 0", ">= 1"


def _reader(convert: Callable[[str], Any], expected: str) -> Callable[[Mapping[str, str], str, Any], Any]:
    """A variable's reader: its value ``convert``ed (``ConfigError``: ``expected``), or the
    default when it is unset or blank."""

    def read(env: Mapping[str, str], key: str, default: Any) -> Any:
        raw = env.get(key)
        if raw is None or raw.strip() == "":
            return default
        try:
            return convert(raw)
        except (ValueError, KeyError):
            raise ConfigError(key, f"expected {expected}, got {raw!r}") from None

    return read


_float = _reader(float, "a number")
_int = _reader(int, "a whole number")
_bool = _reader(lambda raw: {**dict.fromkeys(_TRUE, True), **dict.fromkeys(_FALSE, False)}[raw.strip().lower()],
                "on or off")


VARIABLES: tuple[Variable, ...] = (
    Variable(("AGORA_PG_DATABASE_URL", "DATABASE_URL"), "the embedded server",
             "`postgresql://user:pass@host:5432/db`; the first wins when both are set"),
    Variable(("AGORA_PG_DATA_DIR",), "`.agora-pg`, found upward",
             "where the embedded server keeps its data; by default the `.agora-pg` folder of the current "
             "folder or of the nearest one above it that has one (so every folder of a project finds the same "
             "database), else a new one in the current folder"),
    Variable(("WORKER_CONCURRENCY",), "10",
             "jobs one worker process holds at once (`--concurrency`): a job's slot is free again once its "
             "outcome is written, not when its handler returns, so a worker's memory and the finished but "
             "unrecorded work a crash would run again are bounded by it", "concurrency", _int, ">= 1"),
    Variable(("WORKER_QUEUES",), "`default`", "comma-separated queues to take jobs from (`--queues`)"),
    Variable(("WORKER_POLL_SECONDS",), "1.0", "poll interval when no notification arrives",
             "poll_seconds", _float, "> 0"),
    Variable(("WORKER_MAX_RETRIES",), "3", "`max_retries` of jobs enqueued without one", "max_retries", _int, ">= 0"),
    Variable(("WORKER_LEASE_SECONDS",), "30",
             "a worker's lease on its running jobs (and a pipeline run's); a silent worker's jobs are "
             "rescued after it", "lease_seconds", _float, ">= 1"),
    Variable(("WORKER_NOTIFICATIONS",), "`on`", "`off` stops workers from using `LISTEN` (polling only)"),
    Variable(("WORKER_SHUTDOWN_TIMEOUT",), "30", "seconds running jobs get after SIGTERM",
             "shutdown_timeout", _float, ">= 0"),
    Variable(("WORKER_RETRY_BACKOFF_SECONDS",), "2", "delay before the first retry",
             "retry_backoff_seconds", _float, ">= 0"),
    Variable(("WORKER_RETRY_BACKOFF_MAX_SECONDS",), "3600", "cap of the exponential retry delay",
             "retry_backoff_max_seconds", _float, ">= 0"),
    Variable(("WORKER_JOB_TIMEOUT",), "900",
             "seconds an attempt may run unless its kind or the job says otherwise; `0` for none"),
    Variable(("WORKER_MAX_LOST_ATTEMPTS",), "3",
             "lost attempts (worker gone, lease lost, cut short at shutdown) after which a job fails, apart "
             "from `max_retries`", "max_lost_attempts", _int, ">= 1"),
    Variable(("AGORA_PG_DATABASE_TIMEOUT",), "30",
             "deadline, in seconds, of every database call agora-pg makes (a call past it counts as a lost "
             "connection)", "database_timeout", _float, "> 0"),
    Variable(("AGORA_PG_IDLE_TRANSACTION_TIMEOUT",), "10",
             "seconds after which the server ends a session of agora-pg's left idle inside a transaction (a "
             "process frozen or cut off mid-claim), releasing its locks; at most half of `WORKER_LEASE_SECONDS`, "
             "not set through a transaction pooler", "idle_transaction_timeout", _float, "> 0"),
    Variable(("WORKER_CLAIM_TIMEOUT",), "5",
             "seconds after which a worker cancels a claim that has not answered (the server rolls it back, "
             "with its locks); at most half of `WORKER_LEASE_SECONDS`", "claim_timeout", _float, "> 0"),
    Variable(("AGORA_PG_API_TOKEN",), "none",
             "bearer token the API requires (16+ characters, 8+ different ones); without it the API has no "
             "authentication and answers only this machine"),
    Variable(("AGORA_PG_API_MAX_PAYLOAD_BYTES",), "1048576",
             "largest job payload `POST /jobs` accepts, as JSON (413 above it)", "api_max_payload_bytes", _int, ">= 1"),
    Variable(("AGORA_PG_API_REFUSE_UNKNOWN_KINDS",), "`off`",
             "`on`: `POST /jobs` answers 400 for a kind the API's worker module (`--module`) does not register, "
             "instead of storing a job no worker may handle", "api_refuse_unknown_kinds", _bool),
    Variable(("AGORA_PG_API_ALLOWED_ORIGINS",), "none",
             "comma-separated origins (`http://localhost:3000`) whose pages may call an API that has no "
             "token; others get 403"),
    Variable(("AGORA_PG_API_MAX_CONNECTIONS",), "1000",
             "connections and requests `agora-pg api` serves at once; past it, 503",
             "api_max_connections", _int, ">= 1"),
    Variable(("AGORA_PG_API_MAX_EVENT_STREAMS",), "100",
             "`GET /events` streams open at once on one API process, and never more than half of "
             "`AGORA_PG_API_MAX_CONNECTIONS` (each holds a connection for as long as it lasts); past it, 503 with "
             "`Retry-After`, and the other requests keep their slots", "api_max_event_streams", _int, ">= 1"),
    Variable(("AGORA_PG_API_MAX_CONNECTIONS_PER_CLIENT",), "100",
             "connections `agora-pg api` holds at once for one client address; past it, the client's oldest "
             "idle connection is closed, or (none idle) the new one gets 503 with `Retry-After`. Behind a "
             "reverse proxy every client has the proxy's address: set it to `AGORA_PG_API_MAX_CONNECTIONS`",
             "api_max_connections_per_client", _int, ">= 1"),
    Variable(("AGORA_PG_API_READ_TIMEOUT",), "10",
             "seconds a connection of `agora-pg api` has to send a whole request (headers and body) before "
             "it is closed", "api_read_timeout", _float, "> 0"),
    Variable(("AGORA_PG_API_KEEP_ALIVE_SECONDS",), "5", "seconds an idle keep-alive connection stays open",
             "api_keep_alive_seconds", _int, ">= 1"),
    Variable(("WORKER_HEALTH_PORT",), "the code's",
             "a WorkerPool's health server port, over the `health_port` given in code or config "
             "(`--health-port`; 0: any free port)"),
    Variable(("WORKER_HEALTH_HOST",), "`127.0.0.1`",
             "the address of a WorkerPool's health server (`--health-host`; containers: `0.0.0.0`)"),
    Variable(("WORKER_HEALTH_ERROR_DETAILS",), "`off`",
             "`on`: the health server (which has no login) shows pipelines' raw error texts, not only their "
             "types", "health_error_details", _bool),
    Variable(("AGORA_PG_PRUNE_AFTER",), "`30d`",
             "age after which workers delete done and cancelled jobs (with their runs), pipeline runs and "
             "replayed dead letters; `off` keeps all"),
    Variable(("AGORA_PG_PRUNE_FAILED_AFTER",), "`90d`",
             "the same for jobs that failed for good (never shorter than `AGORA_PG_PRUNE_AFTER`)"),
    Variable(("AGORA_PG_PRUNE_INTERVAL",), "600", "seconds between a worker's pruning rounds",
             "prune_interval", _float, "> 0"),
    Variable(("AGORA_PG_TRANSACTION_POOLING",), "`off`",
             "`on` when the database URL goes through a pooler in transaction mode (PgBouncer's "
             "`pool_mode = transaction`): no prepared statement outlives a transaction, and every statement "
             "runs in a transaction of its own"),
    Variable(("AGORA_PG_LISTEN_DATABASE_URL",), "the database URL",
             "where `LISTEN` connections go; with transaction pooling, the server itself or a session-mode "
             "pool (without it, workers poll)"),
    Variable(("AGORA_PG_PIPELINES_CONFIG",), "none",
             "an `agora/v1` file whose pipelines the API (and its dashboard) may replay dead letters of"),
    Variable(("AGORA_PG_LOG_LEVEL",), "`INFO`", "log level of the `agora-pg` commands (`--log-level`)"),
    Variable(("AGORA_PG_LOG_FORMAT",), "`text`",
             "`json`: one JSON object per log line (`time`, `level`, `logger`, `message`, `exception`) for "
             "log collectors (`--log-format`)"),
    Variable(("AGORA_PG_TEST_DATABASE_URL",), "the embedded server",
             "the server on which the pytest plugin (`agora_pg.testing`) creates its test databases"),
)
# Every variable agora-pg reads; others with these prefixes are likely misspelled.
KNOWN_VARIABLES = frozenset(name for variable in VARIABLES for name in variable.names)
CHECKED_PREFIXES = ("AGORA_PG_", "WORKER_")


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """One line per variable with an agora-pg prefix that agora-pg does not read, naming
    the closest known one (a misspelled setting is otherwise silently ignored)."""
    lines = []
    for name in sorted(env):
        if name.startswith(CHECKED_PREFIXES) and name not in KNOWN_VARIABLES:
            close = difflib.get_close_matches(name, sorted(KNOWN_VARIABLES), n=1, cutoff=0.8)
            hint = f"; did you mean {close[0]}?" if close else ""
            lines.append(f"unknown setting {name} (ignored){hint}")
    return lines


def _retention(env: Mapping[str, str]) -> Retention | None:
    after = env.get("AGORA_PG_PRUNE_AFTER", "").strip()
    if after.lower() in _FALSE:
        return None
    finished = parse_age(after, "AGORA_PG_PRUNE_AFTER") if after else DEFAULT_RETENTION.finished
    failed_text = env.get("AGORA_PG_PRUNE_FAILED_AFTER", "").strip()
    failed = (parse_age(failed_text, "AGORA_PG_PRUNE_FAILED_AFTER") if failed_text
              else max(finished, DEFAULT_RETENTION.failed))
    if failed < finished:
        raise ConfigError("AGORA_PG_PRUNE_FAILED_AFTER", "must not be shorter than AGORA_PG_PRUNE_AFTER")
    return Retention(finished, failed)


def parse_queues(text: str, *, key: str) -> tuple[str, ...]:
    """Split ``"a, b"`` into ``("a", "b")``; an empty list is an error."""
    queues = tuple(part.strip() for part in text.split(",") if part.strip())
    if not queues:
        raise ConfigError(key, f"expected comma-separated queue names, got {text!r}")
    return queues


def _require(condition: bool, key: str, problem: str) -> None:
    if not condition:
        raise ConfigError(key, problem)
