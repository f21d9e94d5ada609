"""Replaying a pipeline's dead letters through its steps and sinks again, for ``agora-pg
dlq replay`` and ``POST /dead-letters/{pipeline_id}/replay`` alike: a run of the pipeline
as a job (``runner.adhoc``) whose payload says ``replay``, so it is leased, fenced and
rescued like any run and never overlaps another run of the pipeline."""

from __future__ import annotations

import dataclasses
from functools import partial

from agora_pg.config import PipelineConfig
from agora_pg.db.pipeline_state import PipelineState
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError
from agora_pg.jobs import JobStatus
from agora_pg.runner.adhoc import run_now
from agora_pg.runner.assembly import build_pipeline
from agora_pg.runner.scheduled_pipeline import REPLAY_FIELD
from agora_pg.settings import Settings


class ReplayFailed(AgoraError):
    """The replay raised (a sink down, say): nothing was marked replayed, its job is
    recorded failed, and the dead letters wait for the next replay."""

    def __init__(self, pipeline_id: str, job_id: int, error: str) -> None:
        super().__init__(f"the replay of {pipeline_id}'s dead letters failed ({error}; job {job_id} recorded it): "
                         f"the dead letters wait for the next replay")
        self.pipeline_id = pipeline_id
        self.job_id = job_id


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    pipeline_id: str
    replayed: int  # dead letters sent through again
    rejected_again: int  # of those, rejected again (new dead letters of ``job_id``)
    job_id: int | None  # the job the replay ran as (None: nothing was waiting)
    run_id: int | None  # its run in agora.runs

    @property
    def written(self) -> int:
        return self.replayed - self.rejected_again

    def text(self) -> str:
        if self.job_id is None:
            return f"no dead letters of {self.pipeline_id} are waiting"
        return (f"replayed {self.replayed} dead letters of {self.pipeline_id}: {self.written} written, "
                f"{self.rejected_again} rejected again (recorded as new dead letters of job {self.job_id})")


async def replay_dead_letters(
    store: Store, settings: Settings, config: PipelineConfig, limit: int, *, wait: bool,
) -> ReplayReport:
    """Send up to ``limit`` of the pipeline's waiting dead letters through its steps and
    sinks as a job of the pipeline, run here: those written are marked replayed, those
    rejected again become new dead letters of the job. It runs after any run of the
    pipeline in flight (``wait=False``: ``RunInFlight`` instead); a replay that raises (a
    sink down) marks nothing, so the letters wait for the next one (``ReplayFailed``)."""
    if not await PipelineState(store).waiting_dead_letters(config.id, 1):
        return ReplayReport(config.id, 0, 0, None, None)
    job = await run_now(store, settings, config.id, partial(build_pipeline, config), wait=wait,
                        **{REPLAY_FIELD: limit})
    runs = await store.runs.of_job(job.id)
    run = runs[-1] if runs else None
    if job.status is not JobStatus.DONE or run is None:
        raise ReplayFailed(config.id, job.id, job.error_message or job.status.value)
    result = run.result or {}
    return ReplayReport(config.id, int(result.get("replayed", 0)), int(result.get("rejected_again", 0)), job.id, run.id)
