"""Who may reach an API that has no token: ASGI middleware, so that it holds whatever
server runs the app (``agora-pg api``, ``uvicorn api.app:app``, a test client).

Without ``AGORA_PG_API_TOKEN`` the API trusts whoever reaches it, so it answers only:

- clients on this machine: a client whose address is an IP that is not loopback gets
  403 (unless the operator passed ``--insecure``);
- requests whose ``Host`` names this machine (``localhost``, ``*.localhost``, a loopback
  IP): a web page that re-points its own name at 127.0.0.1 (DNS rebinding) gets 403;
- requests with no ``Origin``, or the API's own, or one of ``AGORA_PG_API_ALLOWED_ORIGINS``:
  a cross-site form or fetch from a page the developer visits gets 403.

With a token none of this applies: a browser cannot send another site's bearer token.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (names for annotations: the worker's health server needs no Litestar)
    from litestar.types import ASGIApp, Receive, Scope, Send


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, a ``*.localhost`` name or a loopback IP (IPv6 with or
    without brackets)."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8000`` -> ``[::1]``)."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def refusal(scope: Mapping[str, Any], allow_remote: bool, allowed_origins: Collection[str]) -> str | None:
    """Why a request to a token-less API is refused, or None when it may go on."""
    client = scope.get("client")
    if not allow_remote and client:
        try:  # a Unix socket or a test client has no IP address: local
            remote = not ipaddress.ip_address(client[0]).is_loopback
        except ValueError:
            remote = False
        if remote:
            return ("this API has no token (AGORA_PG_API_TOKEN) and answers only clients on this machine; "
                    "set a token to serve others")
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}
    host = headers.get("host", "")
    if not allow_remote and host and not is_loopback_host(host_name(host)):
        return (f"this API has no token (AGORA_PG_API_TOKEN) and answers only requests addressed to this "
                f"machine (Host: localhost or a loopback address), not Host: {host[:100]}")
    origin = headers.get("origin")
    if origin is not None:
        own = f"{scope.get('scheme', 'http')}://{host}"
        if origin.lower() != own.lower() and origin not in allowed_origins:
            return (f"this API has no token (AGORA_PG_API_TOKEN) and refuses cross-site requests (Origin "
                    f"{origin[:100]}); list trusted origins in AGORA_PG_API_ALLOWED_ORIGINS")
    return None


def local_only(allow_remote: bool, allowed_origins: Collection[str]) -> Any:
    """Litestar middleware: answer 403 to what ``refusal`` refuses."""

    def middleware(app: ASGIApp) -> ASGIApp:
        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if str(scope["type"]) == "http":  # (a ScopeType is a str enum)
                reason = refusal(scope, allow_remote, allowed_origins)
                if reason is not None:
                    await _forbidden(reason, send)
                    return
            await app(scope, receive, send)

        return guarded

    return middleware


async def _forbidden(reason: str, send: Any) -> None:
    body = json.dumps({"status_code": 403, "detail": reason}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
