from pathlib import Path

import pytest

from agora_pg.errors import ConfigError
from agora_pg.settings import Settings, load_settings, parse_queues


def test_defaults_with_empty_environment() -> None:
    settings = load_settings({})
    assert settings == Settings()
    assert settings.database_url is None
    assert settings.data_dir == Path(".agora-pg")
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
