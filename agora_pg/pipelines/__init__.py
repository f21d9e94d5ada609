"""Pipelines: ``Pipeline(source, id=...).map(...).filter(...).build(*sinks)``."""

from agora_pg.db.connect import connect_db
from agora_pg.errors import PipelineInterrupted
from agora_pg.pipelines.pipeline import (
    BuiltPipeline,
    NothingWritten,
    Pipeline,
    RunReport,
    TooManyDeadLetters,
)
from agora_pg.pipelines.sinks import DatabaseSink, JsonlSink, Sink, StdoutSink
from agora_pg.pipelines.sources import CsvSource, IterableSource, Source, SqlSource
from agora_pg.pipelines.tracing import Tracing

__all__ = [
    "BuiltPipeline", "NothingWritten", "connect_db", "CsvSource", "DatabaseSink", "IterableSource", "JsonlSink", "Pipeline", "PipelineInterrupted", "RunReport", "Sink",
    "Source", "SqlSource", "StdoutSink", "TooManyDeadLetters", "Tracing",
]
