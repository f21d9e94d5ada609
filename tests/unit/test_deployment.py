"""docker-compose.yml and the Dockerfile: no Docker engine runs here, so check what they
would run: each service's command parses, its environment makes valid settings, and the
image holds every file the commands need."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agora_pg.cli import build_parser
from agora_pg.commands.serve import check_bind
from agora_pg.settings import load_settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, dict[str, object]]:
    text = (REPO / "docker-compose.yml").read_text()
    # what the operator must set in .env
    text = re.sub(r"\$\{AGORA_PG_API_TOKEN:\?[^}]*\}", "0123456789abcdef" * 2, text)
    text = re.sub(r"\$\{POSTGRES_PASSWORD:\?[^}]*\}", "pw", text)
    services: dict[str, dict[str, object]] = yaml.safe_load(text)["services"]
    return services


def test_services_and_their_order(compose: dict[str, dict[str, object]]) -> None:
    assert set(compose) == {"postgres", "migrate", "api", "worker"}
    assert compose["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for service in ("api", "worker"):
        assert compose[service]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert "ports" not in compose["worker"]  # so that --scale worker=3 cannot collide


@pytest.mark.parametrize("service", ["migrate", "api", "worker"])
def test_each_command_parses_and_its_environment_is_valid(compose: dict[str, dict[str, object]], service: str) -> None:
    command = compose[service]["command"]
    assert isinstance(command, list) and command[0] == "agora-pg"
    args = build_parser().parse_args(command[1:])
    environment = compose[service]["environment"]
    assert isinstance(environment, dict)
    settings = load_settings({key: str(value) for key, value in environment.items()})
    assert settings.database_url == "postgresql://agora:pw@postgres:5432/agora"
    if args.command == "api":
        check_bind(args.host, settings.api_token, args.insecure)  # a public bind with its token is allowed
    if args.command == "worker":
        assert (REPO / f"{args.module}.py").exists()
        assert compose[service]["stop_grace_period"] == "40s" and settings.shutdown_timeout < 40


def test_the_image_copies_what_the_commands_need() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = {part for line in dockerfile.splitlines() if line.startswith("COPY") for part in line.split()[1:-1]}
    assert {"pyproject.toml", "README.md", "alembic.ini", "agora_pg", "worker.py", "families", "api"} <= copied
    for name in copied:
        assert (REPO / name).exists(), name


def test_the_base_image_is_pinned_by_digest() -> None:
    """A tag moves; a digest names the same bytes at every build."""
    bases = re.findall(r"^FROM\s+(\S+)", (REPO / "Dockerfile").read_text(), flags=re.MULTILINE)
    assert bases
    for reference in bases:
        assert re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", reference), reference


def test_no_secret_is_written_in_the_compose_file() -> None:
    """The password and the token come from .env (not committed, not in the image)."""
    text = (REPO / "docker-compose.yml").read_text()
    services = yaml.safe_load(text)["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert "agora:agora@" not in text
    for line in (REPO / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            assert line.split("=", 1)[1].startswith("change-me"), line
    for ignore in (".gitignore", ".dockerignore"):
        assert ".env" in (REPO / ignore).read_text().split(), ignore


def test_the_build_context_leaves_out_local_state() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".agora-pg", ".git", ".env"} <= set(ignored)


def test_api_and_worker_restart_and_have_healthchecks(compose: dict[str, dict[str, object]]) -> None:
    for service in ("postgres", "api", "worker"):
        assert compose[service]["restart"] == "unless-stopped", service
        assert compose[service]["healthcheck"], service
    worker_check = " ".join(compose["worker"]["healthcheck"]["test"])  # type: ignore[index]
    worker_py = (REPO / "worker.py").read_text()
    port = re.search(r"health_port=(\d+)", worker_py)
    assert port and f"127.0.0.1:{port.group(1)}/health" in worker_check
    assert compose["worker"]["environment"]["WORKER_HEALTH_HOST"] == "0.0.0.0"  # type: ignore[index]


def test_postgres_is_pinned_to_a_minor_release(compose: dict[str, dict[str, object]]) -> None:
    image = compose["postgres"]["image"]
    assert isinstance(image, str) and re.fullmatch(r"postgres:\d+\.\d+(-\w+)?(@sha256:[0-9a-f]{64})?", image), image
