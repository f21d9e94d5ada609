"""``/runs``: the run history of jobs and scheduled pipelines."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromQuery, QueryParameter

from agora_pg.api import params
from agora_pg.api.schemas import RunOut, RunPage
from agora_pg.db.store import Store
from agora_pg.errors import InvalidArgument
from agora_pg.jobs import RunStatus, possible_job_id


class RunController(Controller):
    path = "/runs"
    tags = ["runs"]

    @get("/")
    async def list_runs(
        self,
        store: NamedDependency[Store],
        pipeline_id: FromQuery[str | None] = None,
        job_id: FromQuery[int | None] = None,
        status: FromQuery[RunStatus | None] = None,
        since: FromQuery[datetime | None] = None,
        until: FromQuery[datetime | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=params.MAX_LIMIT)] = params.DEFAULT_LIMIT,
        cursor: FromQuery[str | None] = None,
    ) -> RunPage:
        """Runs newest first; ``since``/``until`` bound their start time; page on with ``cursor``."""
        if job_id is not None and not possible_job_id(job_id):
            raise InvalidArgument("job_id", f"no job can have id {job_id}")
        filters = {
            "pipeline_id": params.text_filter("pipeline_id", pipeline_id),
            "job_id": job_id,
            "status": None if status is None else status.value,
            "since": params.aware("since", since),
            "until": params.aware("until", until),
            "before_id": params.cursor_id(cursor),
        }
        runs = await store.list_runs(filters, params.page_limit(limit))
        return RunPage([RunOut.of(run) for run in runs], params.next_cursor([run.id for run in runs], limit))
