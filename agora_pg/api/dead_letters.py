"""``/dead-letters/{pipeline_id}/replay``: replay a pipeline's dead letters, for the
pipelines of ``AGORA_PG_PIPELINES_CONFIG``."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.exceptions import NotFoundException
from litestar.params import FromPath, QueryParameter

from agora_pg.db.store import Store
from agora_pg.runner.replay import replay_dead_letters
from agora_pg.settings import Settings

MAX_REPLAY = 10_000


class ReplayOut(msgspec.Struct, kw_only=True):
    """What a replay did: ``written`` + ``rejected_again`` = ``replayed``; ``job_id`` is
    the job it ran as and ``run_id`` its run (both null when nothing was waiting)."""

    pipeline_id: str
    replayed: int
    written: int
    rejected_again: int
    job_id: int | None
    run_id: int | None


@post("/dead-letters/{pipeline_id:str}/replay", status_code=200, tags=["dead letters"])
async def replay(
    request: Request[Any, Any, State],
    store: NamedDependency[Store],
    settings: NamedDependency[Settings],
    pipeline_id: FromPath[str],
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_REPLAY)] = 1000,
) -> ReplayOut:
    """Send up to ``limit`` waiting dead letters of a pipeline of the API's
    ``AGORA_PG_PIPELINES_CONFIG`` through its steps and sinks again; 404 for a pipeline
    that file does not have, 409 while a run of it (scheduled, ad hoc or a replay) is in
    flight; the replay is a job of the pipeline, run by this process."""
    pipelines = request.app.state.pipelines
    config = pipelines.get(pipeline_id)
    if config is None:
        known = ", ".join(sorted(pipelines)) or "none: AGORA_PG_PIPELINES_CONFIG is not set"
        raise NotFoundException(f"no pipeline {pipeline_id[:100]!r} to replay (the API knows: {known})")
    report = await replay_dead_letters(store, settings, config, limit, wait=False)
    return ReplayOut(pipeline_id=report.pipeline_id, replayed=report.replayed, written=report.written,
                     rejected_again=report.rejected_again, job_id=report.job_id, run_id=report.run_id)
