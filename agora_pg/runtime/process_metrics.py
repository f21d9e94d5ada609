"""What this worker process did since it started, for its health server's ``/metrics``:
counters and histograms of the job attempts it recorded and the schedule ticks it started,
and the sync handlers' threads it gave up on (which its health answer names too).

Recording is a few dict and list operations per job (no lock, no label lookup: the event
loop is the only writer); the Prometheus metric families are built at scrape time. Every
10 s a worker publishes a ``snapshot()`` to ``agora.process_tallies``; the API's
``/metrics`` serves the sum of every process's (``ProcessMetrics.of``) under the same names.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import secrets
import socket
import time
from collections.abc import Iterable, Iterator
from typing import Any

from agora_pg.printable import escape_controls
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

# Upper bounds (seconds) of the histograms' buckets: from a no-op job to an hour-long one.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
WAIT_BUCKETS = DURATION_BUCKETS
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclasses.dataclass
class Buckets:
    """One histogram's counts: ``counts[i]`` values in (bounds[i-1], bounds[i]], the last
    past every bound."""

    bounds: tuple[float, ...]
    counts: list[int] = dataclasses.field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: (``le``, values at or below it), ending with ``+Inf``."""
        running, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return buckets


@dataclasses.dataclass(frozen=True)
class StuckThread:
    """A sync handler's thread that had not returned a grace after its attempt's deadline."""

    thread: str
    job_id: int
    kind: str
    handler: str
    deadline: float  # time.monotonic() of the attempt's deadline

    def as_json(self) -> dict[str, object]:
        return {"thread": self.thread, "job_id": self.job_id, "kind": self.kind, "handler": self.handler,
                "seconds_past_deadline": round(time.monotonic() - self.deadline, 1)}


class ProcessMetrics:
    """Counters and histograms of one process, or the sum of many (a prometheus_client
    custom collector)."""

    @classmethod
    def of(cls, snapshots: Iterable[dict[str, Any]]) -> ProcessMetrics:
        """The sum of processes' ``snapshot()`` values."""
        total = cls()
        for snapshot in snapshots:
            total.add(snapshot)
        return total

    def snapshot(self) -> dict[str, Any]:
        """The counters and histograms as JSON values (what a process publishes)."""
        def series(histograms: dict[tuple[str, ...], Buckets]) -> list[list[Any]]:
            return [[*key, buckets.counts, buckets.total] for key, buckets in sorted(histograms.items())]
        return {"completed": [[*key, count] for key, count in sorted(self.completed.items())],
                "durations": series(self.durations), "waits": series(self.waits), "lags": series(self.schedule_lags)}

    def since(self, earlier: ProcessMetrics) -> dict[str, Any]:
        """What was counted since ``earlier`` (a copy of these, taken then), as a snapshot."""
        difference = ProcessMetrics.of([self.snapshot()])
        difference.add(earlier.snapshot(), times=-1)
        difference.completed = {key: count for key, count in difference.completed.items() if count}
        for histograms in (difference.durations, difference.waits, difference.schedule_lags):
            for key in [key for key, buckets in histograms.items() if not any(buckets.counts)]:
                del histograms[key]
        return difference.snapshot()

    def add(self, snapshot: dict[str, Any], times: int = 1) -> None:
        """Add another process's ``snapshot()`` to these, ``times`` times (-1: take it away;
        a histogram of other buckets than this version's is left out)."""
        for queue, kind, outcome, count in snapshot.get("completed", ()):
            key = (queue, kind, outcome)
            self.completed[key] = self.completed.get(key, 0) + times * int(count)
        for name, histograms, bounds in (("durations", self.durations, DURATION_BUCKETS),
                                         ("waits", self.waits, WAIT_BUCKETS), ("lags", self.schedule_lags, LAG_BUCKETS)):
            for *key, counts, total in snapshot.get(name, ()):
                if len(counts) != len(bounds) + 1:
                    continue
                buckets = histograms.get(tuple(key))
                if buckets is None:
                    buckets = histograms[tuple(key)] = Buckets(bounds)
                buckets.counts = [mine + times * int(theirs) for mine, theirs in zip(buckets.counts, counts, strict=True)]
                buckets.total += times * float(total)

    def __init__(self) -> None:
        self.completed: dict[tuple[str, str, str], int] = {}
        self.durations: dict[tuple[str, ...], Buckets] = {}  # by (queue, kind)
        self.waits: dict[tuple[str, ...], Buckets] = {}  # by (queue, kind)
        self.schedule_lags: dict[tuple[str, ...], Buckets] = {}  # by (pipeline_id,)
        self.stuck_threads: dict[str, StuckThread] = {}  # by thread name, until the thread returns

    def jobs_recorded(self, outcomes: Iterable[tuple[str, str, str, float, float | None]]) -> None:
        """Outcomes written, each (queue, kind, outcome, ``duration`` from claim to outcome by
        this host's clock, ``wait`` from the job's due time to its start by the database's)."""
        completed, durations, waits = self.completed, self.durations, self.waits
        for queue, kind, outcome, duration, wait in outcomes:
            key = (queue, kind, outcome)
            completed[key] = completed.get(key, 0) + 1
            by_kind = key[:2]
            histogram = durations.get(by_kind)
            if histogram is None:
                histogram = durations[by_kind] = Buckets(DURATION_BUCKETS)
            histogram.observe(duration if duration > 0.0 else 0.0)
            if wait is not None:
                histogram = waits.get(by_kind)
                if histogram is None:
                    histogram = waits[by_kind] = Buckets(WAIT_BUCKETS)
                histogram.observe(wait if wait > 0.0 else 0.0)

    def schedule_started(self, pipeline_id: str, lag: float) -> None:
        """A scheduled run started ``lag`` seconds after its tick (the database's clock)."""
        lags = self.schedule_lags.get((pipeline_id,))
        if lags is None:
            lags = self.schedule_lags[(pipeline_id,)] = Buckets(LAG_BUCKETS)
        lags.observe(max(lag, 0.0))

    def thread_stuck(self, stuck: StuckThread) -> None:
        self.stuck_threads[stuck.thread] = stuck

    def thread_returned(self, thread: str) -> None:
        self.stuck_threads.pop(thread, None)

    def collect(self) -> Iterator[Metric]:
        completed = CounterMetricFamily(
            "agora_jobs_completed", "Job attempts whose outcome was recorded (by this worker process; in the "
            "API's /metrics, by every worker process), by outcome (succeeded, failed, cancelled, lost, released).",
            labels=["queue", "kind", "outcome"],
        )
        for labels, count in sorted(self.completed.items()):
            completed.add_metric([escape_controls(value, newlines=None) for value in labels], count)
        yield completed
        yield self._histogram("agora_job_duration_seconds", "Seconds from claim to outcome of the job "
                              "attempts recorded.", ["queue", "kind"], self.durations)
        yield self._histogram("agora_job_wait_seconds", "Seconds a job waited from its due time (run_at: "
                              "enqueue, or the end of its delay) to the start of an attempt.",
                              ["queue", "kind"], self.waits)
        yield self._histogram("agora_schedule_lag_seconds", "Seconds from a schedule's tick to the start of "
                              "its run.", ["pipeline_id"], self.schedule_lags)
        stuck = GaugeMetricFamily(
            "agora_stuck_threads", "Sync handlers' threads given up after their attempt's timeout plus a lease "
            "(recorded timed out, still running: the process stops to be restarted); the value is seconds past "
            "the deadline.", labels=["thread", "job_id", "kind"],
        )
        now = time.monotonic()
        for name, thread in sorted(self.stuck_threads.items()):
            stuck.add_metric([escape_controls(value, newlines=None) for value in (name, str(thread.job_id), thread.kind)],
                             now - thread.deadline)
        yield stuck

    @staticmethod
    def _histogram(name: str, documentation: str, labels: list[str],
                   series: dict[tuple[str, ...], Buckets]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, documentation, labels=labels)
        for key, buckets in sorted(series.items()):
            family.add_metric([escape_controls(value, newlines=None) for value in key], buckets.cumulative(),
                              sum_value=buckets.total)
        return family


def merge_snapshots(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """The sum of processes' snapshots, as one snapshot."""
    return ProcessMetrics.of(snapshots).snapshot()


PROCESS_METRICS = ProcessMetrics()  # the one of this process: workers record into it, /metrics reads it
PROCESS_ID = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"  # its agora.process_tallies row


class TalliesPublisher:
    """Adds what this process counted since its last publication to its row of
    ``agora.process_tallies`` (a delta, so that a process whose row was retired while it
    was cut off from the database counts nothing twice), and folds the rows of processes
    silent for ``SILENT_SECONDS`` into the retired sum. One per process: every worker of
    the process calls ``publish``; each delta is taken before any await, so two never
    overlap."""

    SILENT_SECONDS = 600.0
    RETIRE_EVERY_SECONDS = 60.0

    def __init__(self, metrics: ProcessMetrics, process_id: str) -> None:
        self.metrics = metrics
        self.process_id = process_id
        self.published = ProcessMetrics()
        self._retire_due = 0.0

    async def publish(self, workers: Any) -> None:
        """Publish through ``workers`` (a Store's ``WorkerTable``)."""
        delta = self.metrics.since(self.published)
        if any(delta.values()):
            self.published.add(delta)
            try:
                await workers.add_tallies(self.process_id, delta, merge_snapshots)
            except BaseException:
                self.published.add(delta, times=-1)  # (published again next time)
                raise
        if time.monotonic() >= self._retire_due:
            self._retire_due = time.monotonic() + self.RETIRE_EVERY_SECONDS
            await workers.retire_tallies(self.SILENT_SECONDS, merge_snapshots)


TALLIES = TalliesPublisher(PROCESS_METRICS, PROCESS_ID)
