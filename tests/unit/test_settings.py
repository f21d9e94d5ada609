from pathlib import Path

import pytest

from agora_pg.db.connect import Database
from agora_pg.errors import ConfigError
from agora_pg.settings import Settings, load_settings, parse_queues


def test_defaults_with_empty_environment() -> None:
    settings = load_settings({})
    assert settings == Settings()
    assert settings.database_url is None
    assert settings.data_dir is None  # (the nearest .agora-pg upward: db.connect.locate_data_dir)
    assert (settings.poll_seconds, settings.max_retries, settings.lease_seconds) == (1.0, 3, 30.0)
    assert settings.queues == ("default",) and settings.notifications


def test_reads_every_variable() -> None:
    settings = load_settings(
        {
            "DATABASE_URL": "postgresql://a@h/db",
            "AGORA_PG_DATA_DIR": "/tmp/x",
            "WORKER_POLL_SECONDS": "0.5",
            "WORKER_MAX_RETRIES": "5",
            "WORKER_CONCURRENCY": "20",
            "WORKER_LEASE_SECONDS": "12",
            "WORKER_QUEUES": "mail, reports",
            "WORKER_NOTIFICATIONS": "off",
            "WORKER_SHUTDOWN_TIMEOUT": "3",
            "WORKER_RETRY_BACKOFF_SECONDS": "0",
            "WORKER_RETRY_BACKOFF_MAX_SECONDS": "60",
        }
    )
    assert settings.database_url == "postgresql://a@h/db"
    assert settings.data_dir == Path("/tmp/x")
    assert settings.poll_seconds == 0.5 and settings.max_retries == 5 and settings.concurrency == 20
    assert settings.lease_seconds == 12 and settings.queues == ("mail", "reports")
    assert settings.notifications is False and settings.shutdown_timeout == 3
    assert settings.retry_backoff_seconds == 0 and settings.retry_backoff_max_seconds == 60


def test_agora_pg_database_url_wins_over_database_url() -> None:
    env = {"DATABASE_URL": "postgresql://generic/db", "AGORA_PG_DATABASE_URL": "postgresql://ours/db"}
    assert load_settings(env).database_url == "postgresql://ours/db"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("WORKER_POLL_SECONDS", "soon", "expected a number, got 'soon'"),
        ("WORKER_POLL_SECONDS", "0", "must be > 0"),
        ("WORKER_MAX_RETRIES", "2.5", "expected a whole number"),
        ("WORKER_MAX_RETRIES", "-1", "must be >= 0"),
        ("WORKER_CONCURRENCY", "0", "must be >= 1"),
        ("WORKER_LEASE_SECONDS", "0.2", "must be >= 1"),
        ("WORKER_NOTIFICATIONS", "maybe", "expected on or off"),
        ("WORKER_QUEUES", " , ", "expected comma-separated queue names"),
    ],
)
def test_bad_values_name_the_variable(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({key: value})
    assert caught.value.key == key
    assert message in str(caught.value)


def test_parse_queues_strips_and_rejects_empty() -> None:
    assert parse_queues("a,b , c", key="k") == ("a", "b", "c")
    with pytest.raises(ConfigError):
        parse_queues("", key="--queues")


def test_unknown_variables_name_the_closest_known_one() -> None:
    from agora_pg.settings import unknown_variables

    env = {"WORKER_CONCURENCY": "50", "AGORA_PG_DATABSE_URL": "x", "AGORA_PG_XYZZY": "1", "WORKER_QUEUES": "a",
           "PATH": "/bin", "DATABASE_URL": "postgresql://x/y"}
    assert unknown_variables(env) == [
        "unknown setting AGORA_PG_DATABSE_URL (ignored); did you mean AGORA_PG_DATABASE_URL?",
        "unknown setting AGORA_PG_XYZZY (ignored)",
        "unknown setting WORKER_CONCURENCY (ignored); did you mean WORKER_CONCURRENCY?",
    ]


def test_health_port_from_the_environment() -> None:
    assert load_settings({}).health_port is None
    assert load_settings({"WORKER_HEALTH_PORT": "0"}).health_port == 0
    with pytest.raises(ConfigError, match="WORKER_HEALTH_PORT: must be a port number"):
        load_settings({"WORKER_HEALTH_PORT": "70000"})


def test_transaction_pooling_turns_notifications_off_unless_listen_goes_elsewhere() -> None:
    pooled = load_settings({"AGORA_PG_TRANSACTION_POOLING": "on"})
    assert pooled.transaction_pooling and not pooled.notifications
    direct = load_settings({"AGORA_PG_TRANSACTION_POOLING": "on",
                            "AGORA_PG_LISTEN_DATABASE_URL": "postgresql://db:5432/app"})
    assert direct.notifications and direct.listen_database_url == "postgresql://db:5432/app"
    assert load_settings({}).notifications and not load_settings({}).transaction_pooling


def test_listen_through_a_transaction_pooler_is_refused() -> None:
    with pytest.raises(ConfigError, match="WORKER_NOTIFICATIONS.*AGORA_PG_LISTEN_DATABASE_URL"):
        load_settings({"AGORA_PG_TRANSACTION_POOLING": "on", "WORKER_NOTIFICATIONS": "on"})


def test_database_from_settings_carries_pooling_and_listen_url() -> None:
    settings = load_settings({"AGORA_PG_TRANSACTION_POOLING": "on",
                              "AGORA_PG_LISTEN_DATABASE_URL": "postgres://u@db/app"})
    database = Database.from_settings(settings, "postgresql://u@bouncer:6432/app")
    assert database.connect_options == {"statement_cache_size": 0}
    assert database.asyncpg_listen_url == "postgresql://u@db/app"
    assert Database("postgresql://u@db/app").asyncpg_listen_url == "postgresql://u@db/app"
    with pytest.raises(ConfigError, match="AGORA_PG_LISTEN_DATABASE_URL"):
        Database("postgresql://u@db/app", listen_url="mysql://u@db/app")


@pytest.mark.parametrize(("token", "problem"), [
    (" s3cret-token-0123456789", "leading or trailing spaces"),
    ("s3cret-token-0123456789\n", "leading or trailing spaces"),
    ("aaaaaaaaaaaaaaaaaaaa", "fewer than 8 different characters"),
    ("abababababababababab", "fewer than 8 different characters"),
])
def test_a_token_no_client_could_send_or_anyone_could_guess_is_refused(token: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_settings({"AGORA_PG_API_TOKEN": token})


def test_allowed_origins_are_origins() -> None:
    settings = load_settings({"AGORA_PG_API_ALLOWED_ORIGINS": "http://localhost:3000, https://ops.example"})
    assert settings.api_allowed_origins == ("http://localhost:3000", "https://ops.example")
    with pytest.raises(ConfigError, match="AGORA_PG_API_ALLOWED_ORIGINS.*'https://ops.example/app'"):
        load_settings({"AGORA_PG_API_ALLOWED_ORIGINS": "https://ops.example/app"})


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://app:pw@db:5432/app", "postgresql://app:***@db:5432/app"),
    ("postgresql://app:p%40ss:w@db/app", "postgresql://app:***@db/app"),
    ("postgresql://app@db/app?password=hunter2&sslmode=require",
     "postgresql://app@db/app?password=***&sslmode=require"),
    ("postgresql://app@db/app?sslpassword=k3y&PASSWORD=x", "postgresql://app@db/app?sslpassword=***&PASSWORD=***"),
    ("postgresql://postgres@/postgres?host=/tmp/sock&port=5432", "postgresql://postgres@/postgres?host=/tmp/sock&port=5432"),
])
def test_every_secret_a_url_can_hold_is_masked(url: str, shown: str) -> None:
    assert Database(url).display_url == shown
    assert "hunter2" not in Database(url).display_url


def test_retention_ages_and_off() -> None:
    from datetime import timedelta

    from agora_pg.retention import parse_age

    assert load_settings({}).retention is not None and load_settings({}).retention.finished == timedelta(days=30)
    assert load_settings({}).retention.failed == timedelta(days=90)
    assert load_settings({"AGORA_PG_PRUNE_AFTER": "off"}).retention is None
    custom = load_settings({"AGORA_PG_PRUNE_AFTER": "120d"}).retention
    assert custom is not None and custom.failed == timedelta(days=120)  # never shorter than the others
    assert [parse_age(text, "k") for text in ("90s", "15m", "12h", "2w")] == [
        timedelta(seconds=90), timedelta(minutes=15), timedelta(hours=12), timedelta(weeks=2)]
    for env, problem in (({"AGORA_PG_PRUNE_AFTER": "soon"}, "AGORA_PG_PRUNE_AFTER: expected an age"),
                         ({"AGORA_PG_PRUNE_AFTER": "10s"}, "at least a minute"),
                         ({"AGORA_PG_PRUNE_AFTER": "30d", "AGORA_PG_PRUNE_FAILED_AFTER": "7d"}, "not be shorter")):
        with pytest.raises(ConfigError, match=problem):
            load_settings(env)


def test_the_embedded_servers_folder_is_found_upward_like_a_git_repository(tmp_path: Path) -> None:
    from agora_pg.db.connect import locate_data_dir

    project, deep = tmp_path / "project", tmp_path / "project" / "src" / "deep"
    deep.mkdir(parents=True)
    assert locate_data_dir(None, deep) == deep / ".agora-pg"  # none yet: a new one here
    (project / ".agora-pg" / "pgdata").mkdir(parents=True)
    assert locate_data_dir(None, deep) == project / ".agora-pg"
    assert locate_data_dir(None, project) == project / ".agora-pg"
    (deep / ".agora-pg").mkdir()  # a folder without a server in it (a stray one) does not count
    assert locate_data_dir(None, deep) == project / ".agora-pg"
    assert locate_data_dir(tmp_path / "elsewhere", deep) == tmp_path / "elsewhere"
