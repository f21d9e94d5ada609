"""``/runs``: the run history of jobs and scheduled pipelines."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromQuery, QueryParameter

from agora_pg.api import params
from agora_pg.api.schemas import RunOut, RunPage
from agora_pg.db.store import Store
from agora_pg.jobs import RunStatus


class RunController(Controller):
    path = "/runs"
    tags = ["runs"]

    @get("/")
    async def list_runs(
        self,
        store: NamedDependency[Store],
        pipeline_id: FromQuery[str | None] = None,
        job_id: FromQuery[str | None] = None,
        status: FromQuery[RunStatus | None] = None,
        since: FromQuery[str | None] = None,
        until: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=params.MAX_LIMIT)] = params.DEFAULT_LIMIT,
        cursor: FromQuery[str | None] = None,
    ) -> RunPage:
        """Runs newest first; ``since``/``until`` bound their start time; page on with ``cursor``."""
        filters = {
            "pipeline_id": params.text_filter("pipeline_id", pipeline_id),
            "job_id": params.job_id_filter(job_id),
            "status": None if status is None else status.value,
            "since": params.timestamp("since", since),
            "until": params.timestamp("until", until),
            "before_id": params.cursor_id(cursor),
        }
        runs = await store.runs.search(filters, params.page_limit(limit))
        return RunPage([RunOut.of(run) for run in runs], params.next_cursor([run.id for run in runs], limit))
