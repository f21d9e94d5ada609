"""``/health``, ``/ready`` and ``/metrics``."""

from __future__ import annotations

from litestar import Response, get
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE

from agora_pg.api.auth import PUBLIC
from agora_pg.api.errors import public_detail
from agora_pg.api.metrics import CONTENT_TYPE, render_metrics
from agora_pg.api.schemas import Health
from agora_pg.db.store import Store
from agora_pg.runtime.process_metrics import ProcessMetrics
from agora_pg.errors import AgoraError


@get("/health", opt={PUBLIC: True}, tags=["probes"])
async def health() -> Health:
    """The API process is up (it does not touch the database)."""
    return Health("ok")


@get("/ready", opt={PUBLIC: True}, tags=["probes"])
async def ready(store: NamedDependency[Store], state: State) -> Response[Health]:
    """The database answers and its schema is at the migrations' head (503 otherwise)."""
    try:
        await store.ping()
        versions = await store.schema_versions()
        if versions != state.schema_heads:
            heads = ", ".join(sorted(state.schema_heads))
            found = ", ".join(sorted(versions)) or "none"
            return Response(
                Health("not ready", f"schema at {found}, migrations head is {heads}: run agora-pg migrate"),
                status_code=HTTP_503_SERVICE_UNAVAILABLE,
            )
    except AgoraError as error:
        return Response(Health("not ready", public_detail(error)), status_code=HTTP_503_SERVICE_UNAVAILABLE)
    return Response(Health("ready", revision=", ".join(sorted(versions))), status_code=HTTP_200_OK)


@get("/metrics", tags=["probes"], media_type=CONTENT_TYPE)
async def metrics(store: NamedDependency[Store]) -> Response[bytes]:
    """Prometheus text format: live jobs, oldest due job, schedule states, flow control, and
    the counters and histograms of every worker process (published every 10 s)."""
    snapshot = await store.metrics()
    return Response(render_metrics(snapshot, ProcessMetrics.of(snapshot.tallies)), media_type=CONTENT_TYPE)
