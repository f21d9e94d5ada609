"""``create_app(settings)``: the Litestar application of agora-pg."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import RedocRenderPlugin
from litestar.static_files import create_static_files_router
from litestar.routes import HTTPRoute
from litestar._openapi.plugin import OpenAPIPlugin  # (its cached document is what /schema serves)

from agora_pg.api import openapi
from agora_pg.api.auth import PUBLIC, token_guard
from agora_pg.api.dashboard import DashboardFragments, DashboardPages, static_files, template_config
from agora_pg.api.dead_letters import replay
from agora_pg.api.errors import error_response
from agora_pg.api.events import stream_events
from agora_pg.api.exposure import local_only
from agora_pg.api.headers import security_headers
from agora_pg.api.jobs import JobBulkController, JobController
from agora_pg.api.probes import health, metrics, ready
from agora_pg.api.runs import RunController
from agora_pg.api.schedules import ScheduleController
from agora_pg.runner.assembly import read_config
from agora_pg.config import PipelineConfig
from agora_pg.db import migrate
from agora_pg.db.connect import resolve_database
from agora_pg.db.store import Store
from agora_pg.events.stream import EventStream
from agora_pg.settings import Settings
from agora_pg.worker.handlers import kind_table

API_VERSION = "0.1.0"
STATIC = Path(__file__).parent / "static"  # vendored scripts, each with its licence
REDOC_SCRIPT = "redoc.standalone.js"
REQUEST_BODY_HEADROOM = 64 * 1024  # JSON around the payload: kind, name, queue, ...


def create_app(settings: Settings, *, allow_remote: bool = False, handlers: Any = None) -> Litestar:
    """The API on the settings' database (the embedded server when no URL is set),
    through a Store opened for the app's lifetime. Without a token it answers only
    clients of this machine (``allow_remote``: others too, as ``--insecure`` asks) and
    refuses cross-site requests (``agora_pg.api.exposure``). With ``handlers`` (a
    ``Handlers`` table, or a worker module's Worker or WorkerPool), ``POST /jobs`` applies
    each kind's options: its payload type is checked (400 naming the field), its queue and
    max_retries are the defaults, and the OpenAPI document shows the payload types."""
    kinds = kind_table(handlers)

    @contextlib.asynccontextmanager
    async def store_lifespan(app: Litestar) -> AsyncIterator[None]:
        async with resolve_database(settings) as database:
            store = Store.open(database)
            app.state.store = store
            app.state.events = EventStream(store)  # its LISTEN connection opens with the first subscriber
            try:
                yield
            finally:
                await app.state.events.close()
                await store.close()

    app = Litestar(
        route_handlers=[JobController, JobBulkController, ScheduleController, RunController, stream_events, health, ready, metrics,
                        create_static_files_router("/schema/static", directories=[STATIC], include_in_schema=False,
                                                   opt={PUBLIC: True}),
                        DashboardPages, DashboardFragments, static_files(), replay],
        template_config=template_config(),
        dependencies={
            "store": Provide(_store, sync_to_thread=False),
            "settings": Provide(lambda: settings, sync_to_thread=False),
            "kinds": Provide(lambda: kinds, sync_to_thread=False),
        },
        guards=[token_guard(settings.api_token)] if settings.api_token else [],
        middleware=[security_headers, *([] if settings.api_token else [local_only(allow_remote, settings.api_allowed_origins)])],
        exception_handlers={Exception: error_response},
        state=State({"schema_heads": migrate.head_revisions(), "pipelines": _replayable(settings),
                     # (streams hold their connection: at most half the slots, whatever is set)
                     "max_event_streams": min(settings.api_max_event_streams,
                                              max(1, settings.api_max_connections // 2))}),
        lifespan=[store_lifespan],
        request_max_body_size=settings.api_max_payload_bytes + REQUEST_BODY_HEADROOM,
        openapi_config=OpenAPIConfig(
            title="agora-pg", version=API_VERSION, path="/schema",
            # the documentation page loads its script from this package, nothing from a CDN
            render_plugins=[RedocRenderPlugin(js_url=f"/schema/static/redoc/{REDOC_SCRIPT}", google_fonts=False,
                                              favicon="", path="/")],
        ),
        logging_config=None,  # the process's logging stays as its command set it up
    )
    openapi.correct(app.plugins.get(OpenAPIPlugin).provide_openapi_schema(), token=bool(settings.api_token),
                    payload_types={kind: options.payload for kind, options in kinds.items()
                                   if options.payload is not None})
    _allow_names_every_method(app)
    return app


def _allow_names_every_method(app: Litestar) -> None:
    """Litestar answers OPTIONS with the methods of the route it built for a path's first
    handler; when another method joins the path later (GET beside POST on /jobs), that
    answer's ``Allow`` still names the first method only. Point each automatic OPTIONS
    answer at the route that serves its path."""
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            answer = inspect.unwrap(handler.fn)
            if getattr(answer, "__name__", "") != "options_handler":
                continue
            for cell in getattr(answer, "__closure__", None) or ():
                if isinstance(cell.cell_contents, HTTPRoute):
                    cell.cell_contents = route


def _replayable(settings: Settings) -> dict[str, PipelineConfig]:
    """The pipelines of ``AGORA_PG_PIPELINES_CONFIG`` by id (checked at start: a bad file
    stops the API with one line)."""
    if settings.pipelines_config is None:
        return {}
    config = read_config(str(settings.pipelines_config), key="AGORA_PG_PIPELINES_CONFIG")
    return {pipeline.id: pipeline for pipeline in config.pipelines.values()}


def _store(state: State) -> Store:
    store: Store = state.store
    return store
