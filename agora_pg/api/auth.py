"""Bearer-token authentication: with ``AGORA_PG_API_TOKEN`` set, every route but the
probes needs ``Authorization: Bearer <token>``."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler

PUBLIC = "public"  # route handler opt marking a route that needs no token


Guard = Callable[[ASGIConnection[Any, Any, Any, Any], BaseRouteHandler], None]


def token_guard(token: str) -> Guard:
    """A Litestar guard comparing the bearer token in constant time."""
    expected = token.encode()

    def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        if handler.opt.get(PUBLIC):
            return
        scheme, _, given = connection.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise NotAuthorizedException(
                "missing or wrong bearer token", headers={"WWW-Authenticate": 'Bearer realm="agora-pg"'}
            )

    return guard
