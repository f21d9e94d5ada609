"""What this worker process did since it started, for its health server's ``/metrics``:
counters and histograms of the job attempts it recorded and the schedule ticks it started,
and the sync handlers' threads it gave up on (which its health answer names too).

Recording is a few dict and list operations per job (no lock, no label lookup: the event
loop is the only writer); the Prometheus metric families are built at scrape time.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Iterable, Iterator

from agora_pg.printable import escape_controls
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

# Upper bounds (seconds) of the histograms' buckets: from a no-op job to an hour-long one.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
WAIT_BUCKETS = DURATION_BUCKETS
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
UNREGISTERED_KIND = "(unregistered)"  # the kind label of jobs no handler of this worker knows


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
    """Counters and histograms of one process (a prometheus_client custom collector)."""

    def __init__(self) -> None:
        self.completed: dict[tuple[str, str, str], int] = {}
        self.durations: dict[tuple[str, ...], Buckets] = {}  # by (queue, kind)
        self.waits: dict[tuple[str, ...], Buckets] = {}  # by (queue, kind)
        self.schedule_lags: dict[tuple[str, ...], Buckets] = {}  # by (pipeline_id,)
        self.stuck_threads: dict[str, StuckThread] = {}  # by thread name, until the thread returns

    def job_recorded(self, queue: str, kind: str, outcome: str, duration: float, wait: float | None) -> None:
        """An attempt's outcome was written: ``duration`` from claim to outcome (this host's
        clock), ``wait`` from the job's due time to its start (the database's clock)."""
        self.jobs_recorded([(queue, kind, outcome, duration, wait)])

    def jobs_recorded(self, outcomes: Iterable[tuple[str, str, str, float, float | None]]) -> None:
        """Many ``job_recorded`` calls in one (a batch of outcomes: half the time per job)."""
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
            "agora_jobs_completed", "Job attempts whose outcome this worker process recorded, by outcome "
            "(succeeded, failed, cancelled, lost, released).", labels=["queue", "kind", "outcome"],
        )
        for labels, count in sorted(self.completed.items()):
            completed.add_metric([escape_controls(value, newlines=None) for value in labels], count)
        yield completed
        yield self._histogram("agora_job_duration_seconds", "Seconds from claim to outcome of the job "
                              "attempts this process recorded.", ["queue", "kind"], self.durations)
        yield self._histogram("agora_job_wait_seconds", "Seconds a job waited from its due time (run_at: "
                              "enqueue, or the end of its delay) to the start of an attempt.",
                              ["queue", "kind"], self.waits)
        yield self._histogram("agora_schedule_lag_seconds", "Seconds from a schedule's tick to the start of "
                              "its run in this process.", ["pipeline_id"], self.schedule_lags)
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


PROCESS_METRICS = ProcessMetrics()  # the one of this process: workers record into it, /metrics reads it
