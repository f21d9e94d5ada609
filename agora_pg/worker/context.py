"""What a handler can reach while it runs: ``job_context()`` gives the job being run and
``progress()``, from an async handler or from a sync one in its thread."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import threading
from collections.abc import Generator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agora_pg import progress as progress_reports
from agora_pg.errors import AgoraError, DatabaseUnavailable
from agora_pg.jobs import Job
from agora_pg.lifecycle import wait_for_event

if TYPE_CHECKING:
    from agora_pg.db.store import Store

log = logging.getLogger("agora_pg.worker")


class NoJobContext(AgoraError):
    """``job_context()`` was called outside a job handler."""

    def __init__(self) -> None:
        super().__init__("job_context() is only available while a worker runs a job handler (and in its thread)")


class Reported:
    """What ``JobContext.progress`` returns: awaiting it is allowed and returns at once."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # (a generator that ends at once)


REPORTED = Reported()


@dataclasses.dataclass(frozen=True, slots=True)
class JobContext:
    """The job a handler is running, and where its progress goes."""

    job: Job
    reporter: ProgressReporter | None

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> Reported:
        """Report progress: ``done`` of ``total`` (any unit) and a message. Returns at once
        (``await`` on it is optional); the latest report is written to the job's row and
        published at most every ``progress.REPORT_INTERVAL_SECONDS``. Raises TypeError or
        ValueError for a count that is not a finite number >= 0."""
        document = progress_reports.job_progress(done, total, message, datetime.now(UTC))
        if self.reporter is not None:
            self.reporter.report(self.job.id, self.job.attempt, progress_reports.as_json(document))
        return REPORTED


# The attempt being run (a ``worker.attempts.Attempt``), set by the task that runs it: a
# JobContext is built only when a handler asks for one.
current_attempt: contextvars.ContextVar[Any] = contextvars.ContextVar("agora_current_attempt")


def job_context() -> JobContext:
    """The running job's context; raises ``NoJobContext`` outside a handler."""
    try:
        attempt = current_attempt.get()
    except LookupError:
        raise NoJobContext() from None
    return JobContext(attempt.job, attempt.reporter)


class ProgressReporter:
    """A worker's progress writer: keeps the latest report of each attempt and writes
    them all in one statement at most every ``interval`` seconds (so a handler reporting
    in a tight loop costs the server two writes a second at most). A report that cannot
    be written (the database is away) is dropped with a log line: progress never fails
    a job. An attempt's last pending report is written (``flush``) before its outcome, so
    that its run keeps it; reports that come after are ignored by the statement's fence."""

    def __init__(self, store: Store, worker_id: str,
                 interval: float = progress_reports.REPORT_INTERVAL_SECONDS) -> None:
        self.store = store
        self.worker_id = worker_id
        self.interval = interval
        self._pending: dict[tuple[int, int], str] = {}
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def report(self, job_id: int, attempt: int, document: str) -> None:
        """Keep ``document`` as the attempt's latest report (callable from any thread)."""
        if threading.get_ident() == self._loop_thread:
            self._keep(job_id, attempt, document)
        else:
            self._loop.call_soon_threadsafe(self._keep, job_id, attempt, document)

    def _keep(self, job_id: int, attempt: int, document: str) -> None:
        self._pending[(job_id, attempt)] = document
        self._wake.set()

    def has_pending(self, job_id: int, attempt: int) -> bool:
        return (job_id, attempt) in self._pending

    async def flush(self, job_id: int, attempt: int) -> None:
        """Write the attempt's pending report now: its last report before it ends is the
        one kept with its run."""
        document = self._pending.pop((job_id, attempt), None)
        if document is not None:
            await self._write({(job_id, attempt): document})

    async def _write(self, reports: dict[tuple[int, int], str]) -> None:
        try:
            await self.store.jobs.report_progress(
                self.worker_id, [(job_id, attempt, document) for (job_id, attempt), document in reports.items()]
            )
        except DatabaseUnavailable as error:
            log.warning("progress of %d job(s) not written: %s", len(reports), error)
        except Exception:
            log.exception("progress of %d job(s) not written", len(reports))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_for_event(self._wake, 1.0)
            self._wake.clear()
            if not self._pending:
                continue
            reports, self._pending = self._pending, {}
            await self._write(reports)
            await wait_for_event(stop, self.interval)
