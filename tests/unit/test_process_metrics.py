"""The worker process's counters and histograms, as Prometheus renders them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from agora_pg.runtime.process_metrics import Buckets, ProcessMetrics


def test_buckets_are_cumulative_with_inclusive_upper_bounds() -> None:
    buckets = Buckets((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 7.0):
        buckets.observe(value)
    assert buckets.cumulative() == [("0.1", 2.0), ("1.0", 4.0), ("+Inf", 5.0)]
    assert buckets.total == 8.65


def test_the_families_render_with_prometheus_names() -> None:
    metrics = ProcessMetrics()
    metrics.jobs_recorded([("default", "add", "succeeded", 0.02, 0.003)])
    metrics.jobs_recorded([("default", "add", "succeeded", 0.2, None)])
    metrics.jobs_recorded([("mail", "send", "failed", 1.5, 40.0)])
    metrics.schedule_started("nightly", 0.012)
    metrics.schedule_started("nightly", -0.5)  # a tick claimed early counts as no lag
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    assert 'agora_jobs_completed_total{kind="add",outcome="succeeded",queue="default"} 2.0' in text
    assert 'agora_jobs_completed_total{kind="send",outcome="failed",queue="mail"} 1.0' in text
    assert 'agora_job_duration_seconds_bucket{kind="add",le="0.025",queue="default"} 1.0' in text
    assert 'agora_job_duration_seconds_count{kind="add",queue="default"} 2.0' in text
    assert 'agora_job_wait_seconds_count{kind="add",queue="default"} 1.0' in text  # one wait was unknown
    assert 'agora_job_wait_seconds_bucket{kind="send",le="30.0",queue="mail"} 0.0' in text
    assert 'agora_job_wait_seconds_bucket{kind="send",le="60.0",queue="mail"} 1.0' in text
    assert 'agora_schedule_lag_seconds_bucket{le="0.005",pipeline_id="nightly"} 1.0' in text
    assert 'agora_schedule_lag_seconds_sum{pipeline_id="nightly"} 0.012' in text
    assert "# TYPE agora_jobs_completed_total counter" in text and "# TYPE agora_job_duration_seconds histogram" in text


def test_snapshots_add_up_and_a_delta_holds_only_what_came_since() -> None:
    one = ProcessMetrics()
    one.jobs_recorded([("q", "k", "succeeded", 0.02, 0.5)])
    one.schedule_started("p", 0.01)
    published = ProcessMetrics.of([one.snapshot()])  # what was published so far
    one.jobs_recorded([("q", "k", "succeeded", 2.0, None)])
    one.jobs_recorded([("q", "k", "failed", 0.02, 0.1)])
    delta = one.since(published)
    assert delta["completed"] == [["q", "k", "failed", 1], ["q", "k", "succeeded", 1]]
    assert delta["lags"] == [] and [row[:2] for row in delta["waits"]] == [["q", "k"]]
    published.add(delta)
    assert published.snapshot() == one.snapshot()  # the sum of the deltas is the whole
    assert one.since(published) == {"completed": [], "durations": [], "waits": [], "lags": []}
    fleet = ProcessMetrics.of([one.snapshot(), one.snapshot()])
    assert fleet.completed[("q", "k", "succeeded")] == 4
    assert sum(fleet.durations[("q", "k")].counts) == 6 and fleet.durations[("q", "k")].total == 2 * 2.04
    stranger = {"durations": [["q", "k", [1, 2], 3.0]]}  # other buckets (another version): left out
    fleet.add(stranger)
    assert sum(fleet.durations[("q", "k")].counts) == 6
