"""``/jobs``: enqueue, list, show, retry and cancel jobs."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
from litestar import Controller, Response, get, post
from litestar.connection import ASGIConnection
from litestar.exceptions import NotFoundException
from litestar.handlers.base import BaseRouteHandler
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from agora_pg.api import params
from agora_pg.api.errors import PayloadTooLarge, check_json_body
from agora_pg.api.schemas import JobCreate, JobOut, JobPage
from agora_pg.db.store import Store
from agora_pg.db.worker_table import WORKER_ALIVE_SECONDS
from agora_pg.errors import InvalidJob, InvalidTransition, JobConflict, JobNotFound
from agora_pg.job_spec import JobSpec
from agora_pg.jobs import JobStatus
from agora_pg.settings import Settings
from agora_pg.worker.handlers import KindTable, apply_kinds


_JOB_ID_SEGMENT = re.compile(r"/jobs/([^/]+)")


def plain_job_id(connection: ASGIConnection[Any, Any, Any, Any], _handler: BaseRouteHandler) -> None:
    """Guard: a job id in a path is written in plain ASCII digits, without a sign or
    leading zeros (``int()`` would also read ``01``, ``+1`` and ``٣``): 404 otherwise."""
    match = _JOB_ID_SEGMENT.match(connection.scope["path"])
    if match is not None and params.plain_id(match.group(1)) is None:
        raise NotFoundException(f"no job {match.group(1)[:40]!r}: job ids are plain decimal numbers such as 42")


class JobController(Controller):
    path = "/jobs"
    tags = ["jobs"]
    guards = [plain_job_id]

    @post("/", status_code=201, responses=None, before_request=check_json_body)
    async def create_job(
        self, data: JSONBody[JobCreate], store: NamedDependency[Store], settings: NamedDependency[Settings],
        kinds: NamedDependency[KindTable],
    ) -> Response[JobOut]:
        """Enqueue a job: 201 with the new job, or 200 with the live job holding its ``dedup_key``.
        ``warning`` says when no live worker of its queue handles its kind; with
        ``AGORA_PG_API_REFUSE_UNKNOWN_KINDS=on``, a kind the API's worker module does not
        register is refused (400)."""
        size = len(_encoded_payload(data.payload))
        if size > settings.api_max_payload_bytes:
            raise PayloadTooLarge(size, settings.api_max_payload_bytes)
        if settings.api_refuse_unknown_kinds and kinds and data.kind not in kinds:
            raise InvalidJob("kind", f"unknown kind {data.kind!r}: the worker module registers "
                                     f"{', '.join(sorted(kinds))}")
        spec = JobSpec(
            kind=data.kind, payload=data.payload, name=data.name, queue=data.queue, priority=data.priority,
            run_at=data.run_at, max_retries=data.max_retries, dedup_key=data.dedup_key,
            timeout_seconds=data.timeout_seconds,
        )
        [(job, created)] = await store.jobs.enqueue(apply_kinds(kinds, [spec]))
        out = JobOut.of(job)
        if job.status is JobStatus.PENDING:
            handled, live_kinds = await store.workers.live_handlers_of(job.kind, job.queue, WORKER_ALIVE_SECONDS)
            if not handled:
                out.warning = (f"no live worker of queue {job.queue!r} handles kind {job.kind!r}: the job waits "
                               "until one does" + (f" (they handle {', '.join(live_kinds)})" if live_kinds else
                                                   " (none is running)"))
        return Response(out, status_code=201 if created else 200)

    @get("/")
    async def list_jobs(
        self,
        store: NamedDependency[Store],
        status: FromQuery[JobStatus | None] = None,
        kind: FromQuery[str | None] = None,
        queue: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=params.MAX_LIMIT)] = params.DEFAULT_LIMIT,
        cursor: FromQuery[str | None] = None,
        search: FromQuery[str | None] = None,
    ) -> JobPage:
        """Jobs newest first, filtered by status, kind and queue, and ``search``: a job id,
        or text found in the kind, the name or the payload (any case); page on with ``cursor``."""
        filters = {**_filters(status, kind, queue, search), "before_id": params.cursor_id(cursor)}
        jobs = await store.jobs.search(filters, params.page_limit(limit))
        return JobPage([JobOut.of(job) for job in jobs], params.next_cursor([job.id for job in jobs], limit))

    @get("/{job_id:int}")
    async def get_job(self, job_id: FromPath[int], store: NamedDependency[Store]) -> JobOut:
        """One job with all its runs."""
        job = await store.jobs.get(job_id)
        return JobOut.of(job, await store.runs.of_job(job_id))

    @post("/{job_id:int}/retry", status_code=200)
    async def retry_job(self, job_id: FromPath[int], store: NamedDependency[Store]) -> JobOut:
        """Put a failed or cancelled job back to pending, due now (409 otherwise)."""
        return JobOut.of(await store.jobs.retry(job_id))

    @post("/{job_id:int}/cancel", status_code=200)
    async def cancel_job(self, job_id: FromPath[int], store: NamedDependency[Store]) -> JobOut:
        """Cancel a job: one that has not started becomes ``cancelled`` at once; a running one
        is stopped by its worker within about a second (it is returned still ``processing``,
        with ``cancel_requested_at`` set, and ends ``cancelled``). 409 for a finished job."""
        return JobOut.of(await store.jobs.cancel(job_id))


class BulkResult(msgspec.Struct):
    """What a bulk action did: the ids of the jobs it changed, and how many matching jobs
    it left as they were (not in a state for it, or their dedup_key held by another job)."""

    changed: list[int]
    unchanged: int


class JobBulkController(Controller):
    """Retry or cancel every job of a filtered view at once (the filters of ``GET /jobs``)."""

    path = "/jobs/bulk"
    tags = ["jobs"]

    @post("/retry", status_code=200)
    async def retry_jobs(
        self, store: NamedDependency[Store], status: FromQuery[JobStatus | None] = None,
        kind: FromQuery[str | None] = None, queue: FromQuery[str | None] = None, search: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=params.MAX_LIMIT)] = params.MAX_LIMIT,
    ) -> BulkResult:
        """Retry the failed and cancelled jobs among the newest ``limit`` that match, each as
        ``POST /jobs/{id}/retry`` would; the others are left alone."""
        return await _each(store, _filters(status, kind, queue, search), limit, store.jobs.retry)

    @post("/cancel", status_code=200)
    async def cancel_jobs(
        self, store: NamedDependency[Store], status: FromQuery[JobStatus | None] = None,
        kind: FromQuery[str | None] = None, queue: FromQuery[str | None] = None, search: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=params.MAX_LIMIT)] = params.MAX_LIMIT,
    ) -> BulkResult:
        """Cancel the jobs still to run among the newest ``limit`` that match, each as
        ``POST /jobs/{id}/cancel`` would; finished ones are left alone."""
        return await _each(store, _filters(status, kind, queue, search), limit, store.jobs.cancel)


def _filters(status: JobStatus | None, kind: str | None, queue: str | None, search: str | None) -> dict[str, Any]:
    return {
        "status": None if status is None else status.value,
        "kind": params.text_filter("kind", kind),
        "queue": params.text_filter("queue", queue),
        "search": params.text_filter("search", search),
    }


async def _each(store: Store, filters: dict[str, Any], limit: int,
                action: Callable[[int], Awaitable[object]]) -> BulkResult:
    """``action`` on each matching job, one statement each (each fenced as a single call);
    a job it does not apply to is counted, not an error."""
    changed, unchanged = [], 0
    for job in await store.jobs.search(filters, limit):
        try:
            await action(job.id)
        except (InvalidTransition, JobConflict, JobNotFound):
            unchanged += 1
        else:
            changed.append(job.id)
    return BulkResult(changed, unchanged)


def _encoded_payload(value: object) -> bytes:
    """The payload as JSON; text PostgreSQL cannot store (lone surrogates) is bad input."""
    try:
        return msgspec.json.encode(value)
    except UnicodeError:
        raise InvalidJob("payload", "contains text that is not valid UTF-8") from None
