"""``Pipeline(source, id=...).map(f).filter(g).build(*sinks)``: records from a source,
through steps, into sinks, in batches, with checkpoints and dead letters."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from agora_pg import progress
from agora_pg.db.connect import resolve_database
from agora_pg.db.pipeline_state import Checkpoint, DeadLetter, PipelineState
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError, DatabaseUnavailable, PipelineInterrupted
from agora_pg.jobs import Job
from agora_pg.pipelines.records import Record, Rejected, typed
from agora_pg.pipelines.sinks import BatchState, Sink, dead_letter
from agora_pg.pipelines.sources import Source
from agora_pg.pipelines.tracing import Tracing, span
from agora_pg.settings import load_settings

log = logging.getLogger("agora_pg.pipelines")

Step = Callable[[Record], Any]


class TooManyDeadLetters(AgoraError):
    """A run rejected more records than its pipeline allows; the run fails."""


class NothingWritten(AgoraError):
    """A run dead-lettered records and wrote none: it fails (its records wait in
    ``agora.dead_letters`` for a fix and a replay)."""


@dataclasses.dataclass(frozen=True)
class PipelineRun:
    """The run a pipeline executes in: set by the runner (whose runs are jobs: ``job``),
    read by ``BuiltPipeline.run``; a pipeline run directly has none."""

    store: Store
    stopping: asyncio.Event | None = None  # set when the worker stops: end after the current batch
    job: Job | None = None

    @property
    def job_id(self) -> int | None:
        return None if self.job is None else self.job.id

    @property
    def name(self) -> str:
        """How log lines name it."""
        return f" (job {self.job.id})" if self.job is not None else ""


current_run: contextvars.ContextVar[PipelineRun | None] = contextvars.ContextVar("agora_pipeline_run", default=None)


@dataclasses.dataclass(frozen=True)
class RunReport:
    """What one run did."""

    pipeline_id: str
    batches: int
    read: int  # records the source gave
    passed: int  # records that came through the steps to the sinks
    dead_letters: int  # records rejected by the source, a step or a sink
    resumed_after: Any
    written: int = 0  # records every sink took (passed, less those a sink rejected)


@dataclasses.dataclass(frozen=True)
class _StepSpec:
    kind: str  # map or filter
    function: Step
    name: str


class Pipeline:
    """A source, steps and (once built) sinks. Steps return a new Pipeline.

    ``max_dead_letters`` records may be rejected per run (by a step raising, or a
    sink refusing them); they go to ``agora.dead_letters``. One more fails the run.
    """

    def __init__(self, source: Source, *, id: str, batch_size: int = 1000, max_dead_letters: int = 100,
                 tracing: Tracing | None = None, steps: Sequence[_StepSpec] = ()) -> None:
        if not isinstance(id, str) or not id.strip():
            raise ValueError("id must be a non-empty string")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if max_dead_letters < 0:
            raise ValueError("max_dead_letters must be >= 0")
        self.source = source
        self.id = id
        self.batch_size = batch_size
        self.max_dead_letters = max_dead_letters
        self.tracing = tracing
        self.steps = tuple(steps)

    def map(self, function: Step, name: str | None = None) -> Pipeline:
        """Replace each record by ``function(record)`` (sync or async)."""
        return self._with(_StepSpec("map", function, name or _name_of(function)))

    def filter(self, function: Step, name: str | None = None) -> Pipeline:
        """Keep the records for which ``function(record)`` is true."""
        return self._with(_StepSpec("filter", function, name or _name_of(function)))

    def _with(self, step: _StepSpec) -> Pipeline:
        return Pipeline(self.source, id=self.id, batch_size=self.batch_size, max_dead_letters=self.max_dead_letters,
                        tracing=self.tracing, steps=(*self.steps, step))

    def build(self, *sinks: Sink) -> BuiltPipeline:
        if not sinks:
            raise ValueError("build() needs at least one sink")
        return BuiltPipeline(self, list(sinks))


class BuiltPipeline:
    """A runnable pipeline: ``await run()`` reads the source to its end once;
    ``await close()`` flushes the sinks and releases connections."""

    def __init__(self, pipeline: Pipeline, sinks: list[Sink]) -> None:
        self.pipeline = pipeline
        self.sinks = sinks
        self.id = pipeline.id
        self.dead_letter_sink: Sink | None = None

    def with_dead_letter_sink(self, sink: Sink | None) -> BuiltPipeline:
        """Send rejected records to ``sink`` (as ``{pipeline_id, job_id, stage, error_type,
        error_message, record}``) instead of ``agora.dead_letters``."""
        self.dead_letter_sink = sink
        return self

    async def run(self) -> RunReport:
        with span(self.pipeline.tracing, "pipeline.run", {"pipeline.id": self.id}) as run_span:
            async with _run_context() as run:
                report = await self._run(run)
            if run_span is not None:
                run_span.set_attributes({"agora.job_id": run.job_id or -1, "records.read": report.read,
                                         "records.passed": report.passed,
                                         "records.dead_letters": report.dead_letters})
            return report

    async def replay(self, letters: Sequence[DeadLetter]) -> list[Rejected]:
        """Send dead letters through the steps and sinks again; returns those rejected
        again (recorded as new dead letters by the sinks' batch state)."""
        async with _run_context() as run:
            await self._prepare_sinks(run)
            state = PipelineState(run.store)
            # A sink's reject was refused after the steps: it goes straight to the sinks again.
            # Other rejects are records as read: they go through the steps again, the ones a
            # source's schema refused typed again first.
            from_sinks = [letter.record for letter in letters if letter.stage.startswith("sink:")]
            schema = getattr(self.pipeline.source, "schema", None) or {}
            from_steps, source_rejects = [], []
            for letter in [item for item in letters
                           if isinstance(item.record, dict) and not item.stage.startswith("sink:")]:
                try:
                    from_steps.append(typed(letter.record, schema) if letter.stage.startswith("source:") else letter.record)
                except ValueError as error:
                    source_rejects.append(Rejected(letter.stage, letter.record, error))
            kept, rejected = await self._steps(from_steps)
            rejected += source_rejects
            step_letters = [dead_letter(item) for item in rejected]
            return rejected + await self._write(kept + from_sinks, state, run, None, step_letters,
                                                [letter.id for letter in letters if letter.id is not None])

    async def _prepare_sinks(self, run: PipelineRun) -> None:
        # (not the dead-letter sink: the pipeline's id is no default table for its letters)
        for sink in self.sinks:
            await sink.prepare(self.id, run.store)

    async def _run(self, run: PipelineRun) -> RunReport:
        pipeline, state = self.pipeline, PipelineState(run.store)
        await self._prepare_sinks(run)
        resume_after = None
        if pipeline.source.resumable:
            saved = await state.checkpoint(self.id)
            if saved is not None and saved.source == pipeline.source.name:
                resume_after = saved.position
                log.info("pipeline %s resumes %s after %s", self.id, pipeline.source.name, resume_after)
        batches = read = passed = rejected_total = sink_rejected_total = 0
        reported_at = 0.0  # (time.monotonic() of the last progress report)
        first_error: str | None = None
        async for batch in pipeline.source.read(pipeline.batch_size, resume_after):
            attributes = {"pipeline.id": self.id, "batch.index": batches}
            with span(pipeline.tracing, "pipeline.batch", attributes) as batch_span:
                kept, rejected = await self._steps(batch.records)
                rejected = batch.rejected + rejected
                checkpoint = Checkpoint(batch.position, pipeline.source.name) if pipeline.source.resumable else None
                step_letters = [dead_letter(item) for item in rejected]
                sink_rejected = await self._write(kept, state, run, checkpoint, step_letters)
                batches += 1
                read += len(batch.records) + len(batch.rejected)
                passed += len(kept)
                rejected_total += len(rejected) + len(sink_rejected)
                sink_rejected_total += len({id(item.record) for item in sink_rejected})
                if first_error is None and (rejected or sink_rejected):
                    first_error = dead_letter((rejected or sink_rejected)[0]).error_message
                if batch_span is not None:
                    batch_span.set_attributes({"records.read": len(batch.records) + len(batch.rejected),
                                               "records.passed": len(kept),
                                               "records.rejected": len(rejected) + len(sink_rejected)})
            if time.monotonic() - reported_at >= progress.REPORT_INTERVAL_SECONDS:
                await self._report_progress(run, read, passed - sink_rejected_total, rejected_total)
                reported_at = time.monotonic()
            if rejected_total > pipeline.max_dead_letters:
                raise TooManyDeadLetters(
                    f"pipeline {self.id}: {rejected_total} records rejected in this run, more than "
                    f"max_dead_letters={pipeline.max_dead_letters} (see agora-pg dlq list --pipeline {self.id})"
                )
            if pipeline.source.resumable and run.stopping is not None and run.stopping.is_set():
                # A source that cannot resume would be read again from the start: it finishes its run.
                raise PipelineInterrupted(
                    f"pipeline {self.id}: stopped after batch {batches} ({read} records); the next run "
                    f"resumes after {batch.position!r}"
                )
        report = RunReport(self.id, batches, read, passed, rejected_total, resume_after,
                           written=passed - sink_rejected_total)
        await self._report_progress(run, report.read, report.written, report.dead_letters)
        log.info("pipeline %s%s: %d records read, %d written, %d dead-lettered (%d batches)", self.id,
                 run.name, report.read, report.written,
                 report.dead_letters, report.batches)
        if report.written == 0 and report.dead_letters > 0:
            raise NothingWritten(
                f"pipeline {self.id}: every record went to the dead letters ({report.dead_letters} of "
                f"{report.read} read, none written); the first error: {first_error} "
                f"(see agora-pg dlq list --pipeline {self.id})"
            )
        return report

    async def _report_progress(self, run: PipelineRun, read: int, written: int, rejected: int) -> None:
        """Store and publish the run's counts so far as its job's progress (a run outside
        any job has nowhere to keep them)."""
        if run.job is None:
            return
        document = progress.as_json(progress.pipeline_progress(read, written, rejected, datetime.now(UTC)))
        try:
            await run.store.jobs.report_progress(run.job.locked_by or "", [(run.job.id, run.job.attempt, document)])
        except DatabaseUnavailable as error:
            log.warning("pipeline %s%s: progress not written: %s", self.id, run.name, error)

    async def _steps(self, records: list[Record]) -> tuple[list[Record], list[Rejected]]:
        kept: list[Record] = []
        rejected: list[Rejected] = []
        for record in records:
            current: Any = record
            for step in self.pipeline.steps:
                try:
                    result = step.function(current)
                    if inspect.isawaitable(result):
                        result = await result
                except Exception as error:  # noqa: BLE001 - a step's error rejects the record
                    rejected.append(Rejected(f"{step.kind}:{step.name}", record, error))  # as read: replay starts over
                    break
                if step.kind == "filter":
                    if not result:
                        break
                else:
                    current = result
            else:
                kept.append(current)
        return kept, rejected

    async def _write(self, records: list[Record], state: PipelineState, run: PipelineRun,
                     checkpoint: Checkpoint | None, letters: list[DeadLetter], replayed: Sequence[int] = ()
                     ) -> list[Rejected]:
        """Write every sink; the batch state (checkpoint, dead letters, the letters it
        replays) goes in the transaction of a sink on the agora database, or is saved after
        all sinks wrote."""
        committing = next((s for s in self.sinks if s.commits_state_for(run.store.database)), None)
        rejected: list[Rejected] = []
        for sink in self.sinks:
            if sink is not committing:
                rejected += await sink.write(records)
        letters = letters + [dead_letter(item) for item in rejected]
        to_table = self.dead_letter_sink is None
        if not to_table:  # the configured dead-letter sink, before the position moves
            await self._to_dead_letter_sink(run, letters)
            letters = []
        if committing is not None:
            state_in_batch = BatchState(self.id, checkpoint, letters, record_rejects=to_table,
                                        job_id=run.job_id, replayed=replayed)
            committed_rejects = await committing.write(records, state_in_batch)
            if not to_table:  # right after the batch committed
                await self._to_dead_letter_sink(run, [dead_letter(item) for item in committed_rejects])
            rejected += committed_rejects
        else:
            await state.write_batch_state(self.id, checkpoint, letters, run.job_id, replayed)
        return rejected

    async def _to_dead_letter_sink(self, run: PipelineRun, letters: list[DeadLetter]) -> None:
        if not letters or self.dead_letter_sink is None:
            return
        await self.dead_letter_sink.write([
            {"pipeline_id": self.id, "job_id": run.job_id, "stage": letter.stage, "error_type": letter.error_type,
             "error_message": letter.error_message, "record": letter.record}
            for letter in letters
        ])

    async def close(self) -> None:
        """Close the source and flush every sink, even if one of them fails."""
        errors: list[BaseException] = []
        closables: list[Source | Sink] = [self.pipeline.source, *self.sinks]
        if self.dead_letter_sink is not None:
            closables.append(self.dead_letter_sink)
        for closable in closables:
            try:
                await closable.close()
            except Exception as error:  # noqa: BLE001 - close the others, then raise the first
                errors.append(error)
        if errors:
            raise errors[0]


@contextlib.asynccontextmanager
async def _run_context() -> AsyncIterator[PipelineRun]:
    """The runner's run, or (called directly) a Store on the environment's database."""
    run = current_run.get()
    if run is not None:
        yield run
        return
    async with resolve_database(load_settings(os.environ)) as database:
        store = Store.open(database, pool_size=1)
        try:
            yield PipelineRun(store)
        finally:
            await store.close()


def _name_of(function: Callable[..., Any] | Callable[..., Awaitable[Any]]) -> str:
    return getattr(function, "__name__", type(function).__name__)
