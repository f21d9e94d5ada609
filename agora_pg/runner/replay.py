"""Replaying a pipeline's dead letters through its steps and sinks again, for ``agora-pg
dlq replay`` and ``POST /dead-letters/{pipeline_id}/replay`` alike."""

from __future__ import annotations

import dataclasses

from agora_pg.config import PipelineConfig
from agora_pg.db import queries
from agora_pg.db.pipeline_state import PipelineState
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError
from agora_pg.pipelines.pipeline import PipelineRun, current_run
from agora_pg.runner.assembly import build_pipeline
from agora_pg.runtime.process import new_worker_id


class ReplayBusy(AgoraError):
    """Another replay of this pipeline's dead letters is running."""

    def __init__(self, pipeline_id: str) -> None:
        super().__init__(f"another replay of {pipeline_id}'s dead letters is running; try again when it has ended")
        self.pipeline_id = pipeline_id


class ReplayFailed(AgoraError):
    """The replay raised (a sink down, say): nothing was marked replayed, its run is
    recorded failed, and the dead letters wait for the next replay."""

    def __init__(self, pipeline_id: str, run_id: int, error: BaseException) -> None:
        super().__init__(f"the replay of {pipeline_id}'s dead letters failed ({type(error).__name__}; run {run_id} "
                         f"recorded it): the dead letters wait for the next replay")
        self.pipeline_id = pipeline_id
        self.run_id = run_id


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    pipeline_id: str
    replayed: int  # dead letters sent through again
    rejected_again: int  # of those, rejected again (new dead letters of ``run_id``)
    run_id: int | None  # the run the replay was recorded as (None: nothing was waiting)

    @property
    def written(self) -> int:
        return self.replayed - self.rejected_again

    def text(self) -> str:
        if self.run_id is None:
            return f"no dead letters of {self.pipeline_id} are waiting"
        return (f"replayed {self.replayed} dead letters of {self.pipeline_id}: {self.written} written, "
                f"{self.rejected_again} rejected again (recorded as new dead letters of run {self.run_id})")


async def replay_dead_letters(store: Store, config: PipelineConfig, limit: int) -> ReplayReport:
    """Send up to ``limit`` of the pipeline's waiting dead letters through its steps and
    sinks, recorded as a run of its own: those written are marked replayed, those
    rejected again become new dead letters. One replay per pipeline at a time
    (``ReplayBusy``); a replay that raises (a sink down) marks nothing and records its
    run as failed, so the letters wait for the next one."""
    async with store.connection() as lock:
        if not await lock.fetchval(queries.TRY_REPLAY_LOCK, queries.REPLAY_LOCK_CLASS, config.id):
            raise ReplayBusy(config.id)
        try:
            return await _replay(store, config, limit)
        finally:
            await lock.fetchval(queries.REPLAY_UNLOCK, queries.REPLAY_LOCK_CLASS, config.id)


async def _replay(store: Store, config: PipelineConfig, limit: int) -> ReplayReport:
    state = PipelineState(store)
    letters = await state.waiting_dead_letters(config.id, limit)
    if not letters:
        return ReplayReport(config.id, 0, 0, None)
    run_id = await state.start_run(config.id, new_worker_id())
    token = current_run.set(PipelineRun(store, run_id))
    built = build_pipeline(config)
    try:
        again = await built.replay(letters)
    except Exception as error:
        await state.finish_run(run_id, error)
        raise ReplayFailed(config.id, run_id, error) from error
    finally:
        current_run.reset(token)
        await built.close()
    await state.mark_replayed([letter.id for letter in letters if letter.id is not None])
    await state.finish_run(run_id, None)
    return ReplayReport(config.id, len(letters), len(again), run_id)
