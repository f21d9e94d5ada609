"""Which requests an API without a token answers (pure: scopes in, reasons out)."""

from __future__ import annotations

from typing import Any

import pytest

from agora_pg.api.exposure import host_name, is_loopback_host, refusal


def scope(client: str | None = "127.0.0.1", **headers: str) -> dict[str, Any]:
    return {"type": "http", "scheme": "http", "client": (client, 5000) if client else None,
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("LOCALHOST.", True), ("app.localhost", True), ("127.0.0.1", True), ("127.8.0.1", True),
    ("[::1]", True), ("::1", True), ("evil.example", False), ("localhost.evil.example", False),
    ("192.0.2.1", False), ("0.0.0.0", False), ("", False),
])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_host_name_drops_the_port() -> None:
    assert [host_name(h) for h in ("localhost:8000", "[::1]:8000", "[::1]", "127.0.0.1", "::1")] == [
        "localhost", "[::1]", "[::1]", "127.0.0.1", "::1"]


def test_what_is_refused_and_why() -> None:
    assert refusal(scope(Host="localhost:8000"), False, ()) is None
    assert refusal(scope(None, Host="localhost:8000"), False, ()) is None  # a Unix socket
    assert "clients on this machine" in (refusal(scope("192.0.2.1", Host="localhost"), False, ()) or "")
    assert "Host: evil.example" in (refusal(scope(Host="evil.example"), False, ()) or "")
    assert "Origin https://evil.example" in (
        refusal(scope(Host="localhost:8000", Origin="https://evil.example"), False, ()) or "")
    assert refusal(scope(Host="localhost:8000", Origin="null"), False, ()) is not None
    assert refusal(scope(Host="localhost:8000", Origin="http://localhost:8000"), False, ()) is None
    assert refusal(scope(Host="localhost:8000", Origin="http://localhost:3000"), False,
                   ("http://localhost:3000",)) is None
    # --insecure: remote clients and names, but still no cross-site writes
    assert refusal(scope("192.0.2.1", Host="api.example"), True, ()) is None
    assert refusal(scope("192.0.2.1", Host="api.example", Origin="https://evil.example"), True, ()) is not None
