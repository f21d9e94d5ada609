"""``agora-pg worker --config``, ``agora-pg run --config`` and ``agora-pg dlq``."""

from __future__ import annotations

import logging
from functools import partial

from agora_pg.commands.operator import operator_store
from agora_pg.commands.tables import render_table
from agora_pg.config import PipelineConfig, WorkerConfig
from agora_pg.db.pipeline_state import PipelineState
from agora_pg.errors import AgoraError, ConfigError
from agora_pg.jobs import JobStatus
from agora_pg.runner import replay
from agora_pg.runner.adhoc import run_now
from agora_pg.runner.assembly import build_pipeline
from agora_pg.runtime.process import check_schema

log = logging.getLogger("agora_pg")


def selected(config: WorkerConfig, name: str | None) -> list[PipelineConfig]:
    if name is None:
        return list(config.pipelines.values())
    for pipeline in config.pipelines.values():
        if name in (pipeline.name, pipeline.id):
            return [pipeline]
    raise ConfigError("--pipeline", f"no pipeline {name!r} in the config (it has {', '.join(config.pipelines)})")


async def run_once(worker_config: WorkerConfig, name: str | None) -> None:
    """Run each selected pipeline once, now, each as a job of its own (its run recorded
    in agora.runs when it ends, or by a rescuer if this process dies)."""
    pipelines = selected(worker_config, name)
    failures = []
    async with operator_store(pool_size=4) as (store, settings):
        await check_schema(store)
        for config in pipelines:
            job = await run_now(store, settings, config.id, partial(build_pipeline, config))
            if job.status is JobStatus.DONE:
                log.info("pipeline %s: run succeeded (job %d)", config.id, job.id)
            else:
                failures.append(f"{config.id}: {job.error_message or job.status.value} (job {job.id})")
    if failures:
        raise AgoraError("pipeline run failed: " + "; ".join(failures))


async def list_dead_letters(pipeline_id: str | None, include_replayed: bool, limit: int) -> str:
    async with operator_store() as (store, _settings):
        letters = await PipelineState(store).dead_letters(pipeline_id, include_replayed, limit)
    rows = [(letter.id, letter.pipeline_id, letter.job_id, letter.stage, letter.error_type, letter.error_message,
             letter.created_at, letter.replayed_at, letter.record) for letter in letters]
    return render_table(("id", "pipeline", "job", "stage", "error", "message", "created_at", "replayed_at", "record"),
                        rows)


async def replay_dead_letters(worker_config: WorkerConfig, name: str, limit: int) -> str:
    """Send a pipeline's waiting dead letters through its steps and sinks again."""
    [config] = selected(worker_config, name)
    async with operator_store(pool_size=4) as (store, settings):
        report = await replay.replay_dead_letters(store, settings, config, limit, wait=True)
    return report.text()
