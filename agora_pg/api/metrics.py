"""Render a ``MetricsSnapshot`` in the Prometheus text format."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_client.registry import Collector

from agora_pg.printable import escape_controls
from agora_pg.db.run_rows import MetricsSnapshot

CONTENT_TYPE = CONTENT_TYPE_LATEST
MAX_QUEUE_LABELS = 50  # queues named in labels; the rest are summed as queue="other"
OTHER = "other"


def labelled_queues(live_jobs: list[tuple[str, str, int]], limit: int = MAX_QUEUE_LABELS) -> set[str]:
    """The ``limit`` queues with the most live jobs (ties by name): only these become
    label values, so that a flood of distinct queue names cannot bloat a scrape."""
    totals: dict[str, int] = {}
    for queue, _status, count in live_jobs:
        totals[queue] = totals.get(queue, 0) + count
    return set(sorted(totals, key=lambda queue: (-totals[queue], queue))[:limit])


def label_value(text: str) -> str:
    """A label value from outside (a queue, a kind): control and bidi characters escaped
    (the exposition format escapes only newlines, quotes and backslashes)."""
    return escape_controls(text, newlines=None)


def render_metrics(snapshot: MetricsSnapshot, process: Collector | None = None) -> bytes:
    """Gauges read from the database at scrape time (a registry per scrape: the values
    are the database's, not this process's, so nothing accumulates here), and the
    counters and histograms of ``process`` (a worker's ``PROCESS_METRICS``) when given."""
    registry = CollectorRegistry(auto_describe=True)
    if process is not None:
        registry.register(process)
    jobs = Gauge(
        "agora_jobs", "Jobs with work ahead of them (the agora.queue_now view): pending, processing, "
        "or retrying (failed, with a retry left).",
        ["queue", "status"], registry=registry,
    )
    named = labelled_queues(snapshot.live_jobs)
    summed: dict[tuple[str, str], int] = {}
    for queue, status, count in snapshot.live_jobs:
        key = (queue if queue in named else OTHER, status)
        summed[key] = summed.get(key, 0) + count
    for (queue, status), count in summed.items():
        jobs.labels(queue=label_value(queue), status=status).set(count)
    oldest = Gauge(
        "agora_oldest_due_job_age_seconds", "Seconds the oldest due job of a queue (pending or retrying) has waited.",
        ["queue"], registry=registry,
    )
    oldest_of: dict[str, float] = {}
    for queue, age in snapshot.oldest_due_seconds.items():
        label = queue if queue in named else OTHER
        oldest_of[label] = max(age, oldest_of.get(label, age))
    for queue, age in oldest_of.items():
        oldest.labels(queue=label_value(queue)).set(age)
    schedules = Gauge("agora_schedules", "Scheduled pipelines by state.", ["state"], registry=registry)
    for state in ("active", "paused", "stopped", "completed"):
        schedules.labels(state=state).set(snapshot.schedules.get(state, 0))
    Gauge(
        "agora_schedules_in_backoff", "Active schedules waiting out an error backoff.", registry=registry
    ).set(snapshot.schedules_in_backoff)
    Gauge(
        "agora_schedules_orphaned", "Schedules no live process has declared for 120 s (their code is gone, or their "
        "workers are down).", registry=registry
    ).set(snapshot.schedules_orphaned)
    limits = {
        name: Gauge(f"agora_kind_limit{suffix}", text, ["kind"], registry=registry)
        for name, suffix, text in (
            ("concurrency", "", "A limited kind's concurrency limit (per key, for a kind limited by a payload field)."),
            ("rate", "_rate", "A rate-limited kind's starts allowed per window (per key, as the concurrency limit)."),
            ("rate_seconds", "_rate_seconds", "The window of a rate-limited kind's limit, in seconds."),
            ("running", "_running", "Running jobs of a limited kind."),
            ("full_keys", "_full_keys", "Keys of a limited kind at a limit: their due jobs wait for a slot or a window."),
            ("waiting", "_waiting", "Due jobs of a limited kind not running yet."),
            ("waiting_keys", "_waiting_keys", "Keys of fair share (fair_by, else limit_by) among a kind's due jobs "
                                              "waiting: they take turns."),
        )
    }
    queue_limit = Gauge("agora_queue_limit", "A limited queue's concurrency limit (its running jobs: "
                        "agora_jobs{status=\"processing\"}).", ["queue"], registry=registry)
    queue_rate = Gauge("agora_queue_limit_rate", "A limited queue's rate limit: starts in any window.", ["queue"],
                       registry=registry)
    queue_rate_seconds = Gauge("agora_queue_limit_rate_seconds", "The window of a queue's rate limit, in seconds.",
                               ["queue"], registry=registry)
    for queue, queue_limits in snapshot.queue_limits.items():
        if queue_limits.concurrency is not None:
            queue_limit.labels(queue=label_value(queue)).set(queue_limits.concurrency)
        if queue_limits.rate is not None:
            queue_rate.labels(queue=label_value(queue)).set(queue_limits.rate[0])
            queue_rate_seconds.labels(queue=label_value(queue)).set(queue_limits.rate[1])
    unhandled = Gauge("agora_jobs_unhandled", "Claimable jobs of a queue and kind that no live worker handles: "
                      "they wait for one (the most waiting pairs are named).", ["queue", "kind"], registry=registry)
    for waiting in snapshot.unhandled[:MAX_QUEUE_LABELS]:
        unhandled.labels(queue=label_value(waiting.queue), kind=label_value(waiting.kind)).set(waiting.jobs)
    for limit in snapshot.kind_limits:
        for name, gauge in limits.items():
            if getattr(limit, name) is not None:  # (a limit not set has no sample)
                gauge.labels(kind=label_value(limit.kind)).set(getattr(limit, name))
    return generate_latest(registry)
