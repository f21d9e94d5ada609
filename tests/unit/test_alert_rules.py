"""docs/prometheus-alerts.yml only names metrics agora-pg serves."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import yaml

from agora_pg.api.metrics import render_metrics
from agora_pg.db.job_rows import UnhandledJobs
from agora_pg.db.run_rows import MetricsSnapshot
from agora_pg.runtime.process_metrics import ProcessMetrics

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus-alerts.yml"


def test_every_rule_is_well_formed_and_names_only_served_metrics() -> None:
    process = ProcessMetrics()
    process.jobs_recorded([("default", "k", "succeeded", 0.1, 0.1)])
    process.schedule_started("p", 0.1)
    snapshot = MetricsSnapshot(live_jobs=[("default", "pending", 1)], oldest_due_seconds={"default": 1.0},
                               schedules={}, schedules_in_backoff=0,
                               unhandled=[UnhandledJobs("default", "ecoh", 1, datetime.now(UTC))])
    served = set(re.findall(r"^(agora_[a-z_]+)", render_metrics(snapshot, process).decode(), re.MULTILINE))
    [group] = yaml.safe_load(RULES.read_text())["groups"]
    names = set()
    for rule in group["rules"]:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["alert"].startswith("Agora") and rule["annotations"]["summary"], rule
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["expr"]
        used = set(re.findall(r"\b(agora_[a-z_]+)\b", rule["expr"]))
        assert used <= served, f"{rule['alert']} names metrics no agora-pg process serves: {used - served}"
        names |= used
    assert {"agora_jobs_completed_total", "agora_job_wait_seconds_bucket", "agora_schedule_lag_seconds_bucket",
            "agora_oldest_due_job_age_seconds"} <= names
