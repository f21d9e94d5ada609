"""The REST API: ``create_app(settings)`` builds the Litestar application.

(Imported lazily, so that a worker process using ``agora_pg.api.exposure`` or
``agora_pg.api.metrics`` does not load Litestar.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agora_pg.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from agora_pg.api.app import create_app

        return create_app
    raise AttributeError(f"module 'agora_pg.api' has no attribute {name!r}")
