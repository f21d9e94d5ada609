"""The REST API: ``create_app(settings)`` builds the Litestar application."""

from agora_pg.api.app import create_app

__all__ = ["create_app"]
