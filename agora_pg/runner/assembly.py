"""Build pipelines and a WorkerPool from an ``agora/v1`` config (``agora_pg.config``)."""

from __future__ import annotations

import os
from pathlib import Path

from agora_pg.config import Component, PeriodicJobConfig, PipelineConfig, WorkerConfig, load_config
from agora_pg.errors import ConfigError
from agora_pg.pipelines.pipeline import BuiltPipeline, Pipeline
from agora_pg.pipelines.sinks import DatabaseSink, JsonlSink, Sink, StdoutSink
from agora_pg.pipelines.sources import CsvSource, IterableSource, Source, SqlSource
from agora_pg.pipelines.tracing import Tracing, configure_exporter
from agora_pg.runner.periodic_job import PeriodicJob
from agora_pg.runner.worker_pool import ScheduledPipeline, WorkerPool


def read_config(path: str, key: str = "--config") -> WorkerConfig:
    """The config file at ``path``, checked completely before anything runs (``key``
    names where the path came from in errors)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(key, f"cannot read {path}: {error.strerror or error}") from None
    return load_config(text, os.environ, path)


def build_source(component: Component) -> Source:
    options = component.options
    if component.type == "iterable":
        return IterableSource(options["records"])
    if component.type == "csv":
        return CsvSource(options["path"], options["schema"], delimiter=options["delimiter"],
                         encoding=options["encoding"])
    return SqlSource(options["query"], options["database_url"], key=options["key"])


def build_sink(component: Component) -> Sink:
    options = component.options
    if component.type == "stdout":
        return StdoutSink()
    if component.type == "jsonl":
        return JsonlSink(options["path"])
    return DatabaseSink(options["database_url"], options["table"], columns=options["columns"], mode=options["mode"])


def build_pipeline(config: PipelineConfig) -> BuiltPipeline:
    """A fresh pipeline (new source, new sinks) for one run."""
    tracing = None
    if config.tracing is not None and config.tracing.enabled:
        tracing = Tracing(True, config.tracing.service_name, config.tracing.exporter, config.tracing.endpoint)
        configure_exporter(tracing)
    pipeline = Pipeline(build_source(config.source), id=config.id, batch_size=config.batch_size,
                        max_dead_letters=config.max_dead_letters, tracing=tracing)
    dead_letter_sink = build_sink(config.dead_letter_sink) if config.dead_letter_sink is not None else None
    return pipeline.build(*(build_sink(sink) for sink in config.sinks)).with_dead_letter_sink(dead_letter_sink)


def scheduled_pipeline(config: PipelineConfig) -> ScheduledPipeline:
    async def factory() -> BuiltPipeline:
        return build_pipeline(config)

    return ScheduledPipeline(factory=factory, schedule=config.schedule, pipeline_id=config.id,
                             error_backoff_seconds=config.error_backoff_seconds,
                             max_consecutive_errors=config.max_consecutive_errors)


def periodic_job(config: PeriodicJobConfig) -> PeriodicJob:
    return PeriodicJob(
        config.kind, config.schedule, payload=config.payload, queue=config.queue, priority=config.priority,
        max_retries=config.max_retries, timeout_seconds=config.timeout_seconds, pipeline_id=config.id,
        error_backoff_seconds=config.error_backoff_seconds, max_consecutive_errors=config.max_consecutive_errors,
    )


def build_worker_pool(config: WorkerConfig) -> WorkerPool:
    """The WorkerPool a config describes: one ScheduledPipeline per pipeline, one
    PeriodicJob per periodic job, and the flow control its [kinds] declare."""
    pool = WorkerPool(health_port=config.health_port, graceful_shutdown_timeout=config.graceful_shutdown_timeout)
    pool.kind_limits = config.kinds
    pool.queue_limits = config.queues
    for pipeline in config.pipelines.values():
        pool.register(scheduled_pipeline(pipeline))
    for job in config.periodic_jobs.values():
        pool.register(periodic_job(job))
    return pool
