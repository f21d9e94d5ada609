"""FamilyRegistry: register(kind, variant, root_cls) and the worker handler of each kind."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agora_pg import Fail, Job, JobStatus
from agora_pg.families import FamilyRegistry, UnknownVariant

WHEN = datetime(2026, 12, 1, tzinfo=UTC)


def job(kind: str, payload: dict[str, Any]) -> Job:
    return Job(id=1, name=kind, kind=kind, queue="default", status=JobStatus.PROCESSING, payload=payload, priority=0,
               run_at=WHEN, retry_count=0, max_retries=3, error_message=None, dedup_key=None, created_at=WHEN,
               started_at=WHEN, finished_at=None, locked_by="w", lease_expires_at=None, attempt=1)


class Root:
    def __init__(self, resources: Any) -> None:
        self.resources = resources

    async def run(self, payload: dict[str, Any]) -> str:
        return f"{self.resources} {payload['n']}"


async def test_a_job_runs_its_variant_or_the_kinds_default() -> None:
    registry = (FamilyRegistry().register("report", "pdf", lambda job, resources: f"pdf {job.payload['n']}")
                .register("report", "html", Root, default=True))
    handler = registry.handlers()["report"]
    assert await handler(job("report", {"n": 1}), "html") == "html 1"  # the default, not the first
    assert await handler(job("report", {"n": 2, "variant": "pdf"}), None) == "pdf 2"
    first = FamilyRegistry().register("x", "a", lambda job, resources: "a").register("x", "b", Root)
    assert await first.handlers()["x"](job("x", {}), None) == "a"  # no default said: the first registered
    with pytest.raises(UnknownVariant, match=r"report has no variant 7 \(it has html, pdf\)") as raised:
        await handler(job("report", {"n": 3, "variant": 7}), None)
    assert isinstance(raised.value, Fail)  # no retry: it would ask for the same variant


def test_registering_twice_or_a_non_callable_is_refused() -> None:
    registry = FamilyRegistry().register("report", "default", Root)
    with pytest.raises(ValueError, match="registered already"):
        registry.register("report", "default", Root)
    with pytest.raises(TypeError):
        registry.register("report", "other", "not callable")
    with pytest.raises(ValueError, match="non-empty"):
        registry.register("", "default", Root)
