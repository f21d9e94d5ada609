"""ScheduledPipeline and WorkerPool in this process, against a real database."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from agora_pg import schedules
from agora_pg.db import queries
from agora_pg.db.schedule_rows import ScheduleRegistration
from agora_pg.db.store import Store
from agora_pg.runner import PipelineFailed, Schedule, ScheduledPipeline, ScheduleStopped, WorkerPool, scheduled_pipeline
from agora_pg.settings import Settings

from .helpers import wait_until


class Recorder:
    """A factory that counts calls; its pipelines fail while ``failures`` > 0."""

    def __init__(self, failures: int = 0, sleep: float = 0.0) -> None:
        self.calls = 0
        self.closed = 0
        self.failures = failures
        self.sleep = sleep

    async def __call__(self) -> Recorder.Pipeline:
        self.calls += 1
        return Recorder.Pipeline(self)

    class Pipeline:
        def __init__(self, owner: Recorder) -> None:
            self.owner = owner

        async def run(self) -> None:
            await asyncio.sleep(self.owner.sleep)
            if self.owner.failures > 0:
                self.owner.failures -= 1
                raise RuntimeError(f"boom {self.owner.calls}")

        async def close(self) -> None:
            self.owner.closed += 1


async def serve(pipeline: ScheduledPipeline, settings: Settings) -> None:
    """Run ``pipeline`` in a WorkerPool of its own on the test's database, until it ends."""
    await WorkerPool(settings=settings).register(pipeline).run(handle_signals=False)


def serving(pipeline: ScheduledPipeline, settings: Settings) -> asyncio.Task[None]:
    """``pipeline`` running in a WorkerPool of its own until ``pipeline.stop()``."""
    return asyncio.create_task(serve(pipeline, settings))


async def serve_until(pipeline: ScheduledPipeline, store: Store, settings: Settings, condition: Any) -> None:
    task = serving(pipeline, settings)
    try:
        await wait_until(condition, timeout=15)
    finally:
        pipeline.stop()
        await asyncio.wait_for(task, 15)


async def runs(store: Store, pipeline_id: str) -> list[asyncpg.Record]:
    async with store.connection() as connection:
        return await connection.fetch(
            "SELECT status, error_message, scheduled_for, started_at, finished_at, worker_id FROM agora.runs "
            "WHERE pipeline_id = $1 ORDER BY id",
            pipeline_id,
        )


async def test_every_runs_at_once_then_waits_the_interval_after_finishing(store: Store, settings: Settings) -> None:
    factory = Recorder()
    pipeline = ScheduledPipeline(factory=factory, schedule=Schedule.every(hours=1), pipeline_id="hourly")

    async def ran() -> bool:
        return factory.closed == 1

    await serve_until(pipeline, store, settings, ran)
    [run] = await runs(store, "hourly")
    assert run["status"] == "succeeded" and run["worker_id"] is not None
    row = await store.schedules.get("hourly")
    assert row is not None
    assert (row.state, row.consecutive_errors, row.lease_owner) == ("active", 0, None)
    assert row.last_finished_at is not None and row.next_run_at is not None
    assert abs((row.next_run_at - row.last_finished_at).total_seconds() - 3600) < 2

    # a restarted worker in the middle of the interval waits out the rest of it
    restarted = Recorder()
    again = ScheduledPipeline(factory=restarted, schedule=Schedule.every(hours=1), pipeline_id="hourly")
    task = serving(again, settings)
    await asyncio.sleep(1.0)
    again.stop()
    await asyncio.wait_for(task, 10)
    assert restarted.calls == 0
    assert (await store.schedules.get("hourly")).next_run_at == row.next_run_at  # type: ignore[union-attr]


async def test_failures_back_off_and_the_counter_survives_a_restart(store: Store, settings: Settings) -> None:
    factory = Recorder(failures=10)
    first = ScheduledPipeline(factory, Schedule.every(seconds=1), "flaky", error_backoff_seconds=0.05, max_consecutive_errors=5)

    async def two_failures() -> bool:
        row = await store.schedules.get("flaky")
        return row is not None and row.consecutive_errors >= 2

    await serve_until(first, store, settings, two_failures)
    failed_so_far = (await store.schedules.get("flaky")).consecutive_errors  # type: ignore[union-attr]

    second = ScheduledPipeline(factory, Schedule.every(seconds=1), "flaky", error_backoff_seconds=0.05, max_consecutive_errors=5)
    with pytest.raises(PipelineFailed, match="boom"):
        await asyncio.wait_for(serve(second, settings), 20)
    row = await store.schedules.get("flaky")
    assert row is not None
    assert (row.state, row.consecutive_errors) == ("stopped", 5)
    assert row.last_error is not None and row.last_error.startswith("RuntimeError: boom")
    assert factory.calls == 5 and factory.closed == 5  # close runs after failures too
    statuses = [run["status"] for run in await runs(store, "flaky")]
    assert statuses == ["failed"] * 5
    assert failed_so_far >= 2


async def test_backoff_delay_is_recorded_in_next_run_at(store: Store, settings: Settings) -> None:
    factory = Recorder(failures=1)
    pipeline = ScheduledPipeline(factory, Schedule.every(seconds=1), "slow_retry", error_backoff_seconds=60)

    async def failed_once() -> bool:
        row = await store.schedules.get("slow_retry")
        return row is not None and row.consecutive_errors == 1

    await serve_until(pipeline, store, settings, failed_once)
    row = await store.schedules.get("slow_retry")
    assert row is not None and row.next_run_at is not None and row.last_finished_at is not None
    assert 59 <= (row.next_run_at - row.last_finished_at).total_seconds() <= 61


async def test_success_resets_the_error_counter(store: Store, settings: Settings) -> None:
    factory = Recorder(failures=2)
    pipeline = ScheduledPipeline(factory, Schedule.every(hours=1), "recovers", error_backoff_seconds=0.01)

    async def succeeded() -> bool:
        row = await store.schedules.get("recovers")
        return row is not None and row.last_status == "succeeded"

    await serve_until(pipeline, store, settings, succeeded)
    assert (await store.schedules.get("recovers")).consecutive_errors == 0  # type: ignore[union-attr]
    assert [run["status"] for run in await runs(store, "recovers")] == ["failed", "failed", "succeeded"]


async def test_once_runs_once_per_launch(store: Store, settings: Settings) -> None:
    # the seed: "one-shot jobs launched by a scheduler like Airflow or a cron job": each launch runs
    factory = Recorder()
    await asyncio.wait_for(serve(ScheduledPipeline(factory, Schedule.once(), "daily_export"), settings), 10)
    await asyncio.wait_for(serve(ScheduledPipeline(factory, Schedule.once(), "daily_export"), settings), 10)
    assert factory.calls == 2
    assert (await store.schedules.get("daily_export")).state == "completed"  # type: ignore[union-attr]
    assert [run["status"] for run in await runs(store, "daily_export")] == ["succeeded", "succeeded"]


async def test_once_with_a_key_runs_once_ever_for_that_key(store: Store, settings: Settings) -> None:
    factory = Recorder()
    for _launch in (1, 2):
        scheduled = ScheduledPipeline(factory, Schedule.once(key="2024"), "backfill")
        await asyncio.wait_for(serve(scheduled, settings), 10)
    assert factory.calls == 1
    row = await store.schedules.get("backfill")
    assert row is not None and (row.state, row.schedule_spec) == ("completed", "once key=2024")
    await asyncio.wait_for(serve(ScheduledPipeline(factory, Schedule.once(key="2025"), "backfill"), settings), 10)
    assert factory.calls == 2  # a new key is a new once
    assert [run["status"] for run in await runs(store, "backfill")] == ["succeeded", "succeeded"]


@pytest.mark.connections(20)
async def test_two_launches_of_a_once_at_the_same_moment_each_run_and_never_overlap(
    store: Store, settings: Settings
) -> None:
    running: list[int] = []
    overlaps: list[int] = []
    done: list[int] = []

    class Slow:
        async def run(self) -> None:
            running.append(1)
            if len(running) > 1:
                overlaps.append(len(running))
            await asyncio.sleep(0.5)
            running.pop()
            done.append(1)

    async def factory() -> Slow:
        return Slow()

    launches = [serve(ScheduledPipeline(factory, Schedule.once(), "nightly"), settings) for _ in (1, 2)]
    await asyncio.wait_for(asyncio.gather(*launches), 20)
    assert len(done) == 2 and overlaps == []
    statuses = [run["status"] for run in await runs(store, "nightly")]
    assert statuses == ["succeeded", "succeeded"]
    first, second = await runs(store, "nightly")
    assert second["started_at"] >= first["finished_at"]


async def test_a_run_of_one_launch_that_another_launch_ran_counts_for_the_first_only(store: Store) -> None:
    # two launches of a once(): the run launch A planned is claimed by launch B's worker
    once = Schedule.once()
    first, second = (ScheduledPipeline(Recorder(), once, "nightly") for _ in (1, 2))
    first.launch, second.launch = "launch-a", "launch-b"
    await store.schedules.upsert(ScheduleRegistration("nightly", "once", once.spec, None, 60, 10, new_launch=True))
    [(_, job)] = await store.schedules.enqueue_due_ticks([("nightly", once.spec)], first.plan,
                                                         launches={"nightly": "launch-a"})
    [claimed] = await store.jobs.claim([queries.PIPELINE_QUEUE], 1, "worker-of-b", 30, kinds=["nightly"])
    assert (claimed.id, claimed.payload["launch"]) == (job.id, "launch-a")
    assert await store.jobs.complete_succeeded([(claimed.id, claimed.attempt)], "worker-of-b") == {job.id}
    assert (await store.schedules.get("nightly")).state == "completed"  # type: ignore[union-attr]
    assert await store.schedules.launch_succeeded("nightly", "launch-a")
    assert not await store.schedules.launch_succeeded("nightly", "launch-b")
    await store.schedules.launch_once_again("nightly", once.spec)  # launch B wants its own run
    # launch A's scheduler, whatever it last read, plans no second run for A; B's does
    assert await store.schedules.enqueue_due_ticks([("nightly", once.spec)], first.plan,
                                                   launches={"nightly": "launch-a"}) == []
    assert (await store.schedules.next_ticks([("nightly", once.spec)], {"nightly": "launch-a"})).due_in is None
    [(_, again)] = await store.schedules.enqueue_due_ticks([("nightly", once.spec)], second.plan,
                                                           launches={"nightly": "launch-b"})
    assert again.payload["launch"] == "launch-b"


async def test_a_stopped_schedule_says_so_at_start_instead_of_waiting(
    database_url: str, store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = Recorder(failures=100)
    pipeline = ScheduledPipeline(failing, Schedule.every(hours=1), "flaky", error_backoff_seconds=0.0,
                                 max_consecutive_errors=2)
    with pytest.raises(PipelineFailed, match="boom 2"):
        await asyncio.wait_for(serve(pipeline, settings), 15)
    monkeypatch.setenv("AGORA_PG_DATABASE_URL", database_url)
    # a restart of the standalone script: one line saying what happened and how to resume
    restarted = ScheduledPipeline(failing, Schedule.every(hours=1), "flaky", error_backoff_seconds=0.0,
                                  max_consecutive_errors=2)
    with pytest.raises(ScheduleStopped) as stopped:
        await asyncio.wait_for(restarted.start(), 15)
    message = str(stopped.value)
    assert "\n" not in message and "after 2 failed runs" in message and "boom 2" in message
    assert "agora-pg schedules resume flaky" in message and "POST /schedules/flaky/resume" in message
    assert failing.calls == 2  # nothing ran at the restart
    # in a pool, the same error ends the pool
    pool = WorkerPool(settings=settings).register(
        ScheduledPipeline(failing, Schedule.every(hours=1), "flaky", max_consecutive_errors=2))
    with pytest.raises(ScheduleStopped):
        await asyncio.wait_for(pool.run(handle_signals=False), 15)
    await store.schedules.resume("flaky")
    failing.failures = 0
    await serve_until(ScheduledPipeline(failing, Schedule.every(hours=1), "flaky"), store, settings,
                      lambda: _count(failing, 3))


def test_a_called_factory_is_refused_with_the_fix() -> None:
    async def build_pipeline() -> Recorder.Pipeline:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match=r"write factory=build_pipeline, not factory=build_pipeline\(\)"):
        ScheduledPipeline(factory=build_pipeline(), schedule=Schedule.once(), pipeline_id="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got int"):
        ScheduledPipeline(factory=3, schedule=Schedule.once(), pipeline_id="x")  # type: ignore[arg-type]


async def test_changed_schedule_replaces_the_old_one(store: Store, settings: Settings) -> None:
    factory = Recorder()
    await serve_until(ScheduledPipeline(factory, Schedule.every(seconds=5), "report"), store, settings, lambda: _called(factory))
    new = Schedule.cron("0 3 1 1 *", timezone="Europe/Berlin")
    await serve_once_registered(ScheduledPipeline(factory, new, "report"), store, settings)
    row = await store.schedules.get("report")
    assert row is not None and row.schedule_spec == "cron 0 3 1 1 * Europe/Berlin"
    assert row.next_run_at is not None and row.next_run_at.astimezone(UTC).month == 1
    async with store.connection() as connection:  # even when due, the old schedule's workers do not run it
        await connection.execute("UPDATE agora.schedules SET next_run_at = now() - interval '1 minute'")
    plan = ScheduledPipeline(factory, new, "report").plan
    assert await store.schedules.enqueue_due_ticks([("report", Schedule.every(seconds=5).spec)], plan) == []
    assert len(await store.schedules.enqueue_due_ticks([("report", new.spec)], plan)) == 1


async def test_a_spec_changed_while_a_run_is_in_flight_is_kept(store: Store, settings: Settings) -> None:
    gate = asyncio.Event()

    class Waits:
        async def run(self) -> None:
            await gate.wait()

    pipeline = ScheduledPipeline(lambda: Waits(), Schedule.every(seconds=1), "report")
    task = serving(pipeline, settings)
    await wait_until(lambda: _running(store, "report"), timeout=10)
    new = Schedule.cron("0 3 1 1 *", timezone="Europe/Berlin")  # another deploy registers a new schedule
    registered = await store.schedules.upsert(ScheduleRegistration(
        "report", "cron", new.spec, new.first_run_at(await store.database_now()), 60, 10))
    gate.set()  # the run in flight ends now
    await wait_until(lambda: _finished(store, "report"), timeout=10)
    pipeline.stop()
    await asyncio.wait_for(task, 15)
    row = await store.schedules.get("report")
    assert row is not None and (row.schedule_spec, row.last_status) == (new.spec, "succeeded")
    assert row.next_run_at == registered.next_run_at  # the new schedule's, not "1 s after the old run"


async def _running(store: Store, pipeline_id: str) -> bool:
    row = await store.schedules.get(pipeline_id)
    return row is not None and row.lease_owner is not None


async def _finished(store: Store, pipeline_id: str) -> bool:
    row = await store.schedules.get(pipeline_id)
    return row is not None and row.last_finished_at is not None and row.job_id is None


async def test_a_run_whose_worker_died_counts_as_a_failed_run_and_its_late_end_is_fenced(store: Store) -> None:
    spec = Schedule.every(seconds=1).spec
    plan = ScheduledPipeline(Recorder(), Schedule.every(seconds=1), "p").plan
    await store.schedules.upsert(ScheduleRegistration("p", "every", spec, None, 60, 10))
    [(tick, job)] = await store.schedules.enqueue_due_ticks([("p", spec)], plan)
    [claimed] = await store.jobs.claim([queries.PIPELINE_QUEUE], 10, "ghost", 30, kinds=["p"])
    assert claimed.id == job.id
    assert await store.schedules.enqueue_due_ticks([("p", spec)], plan) == []  # no overlap
    async with store.connection() as connection:  # the ghost died: its lease passes
        expired = await connection.fetchval(
            "UPDATE agora.jobs SET lease_expires_at = now() - interval '1 second' RETURNING lease_expires_at")
    assert await store.jobs.rescue_expired(3, 3, 100, lease_seconds=30) == [job.id]
    row = await store.schedules.get("p")
    assert row is not None and row.job_id is None
    assert (row.consecutive_errors, row.last_status, row.state) == (1, "abandoned", "active")
    assert row.last_error is not None and row.last_error.startswith("WorkerLost: worker ghost")
    # the error backoff (60 s) counts from the lease's last renewal (30 s before it expired)
    assert row.next_run_at == expired - timedelta(seconds=30) + timedelta(seconds=60)
    assert (await store.jobs.get(job.id)).status.value == "failed"  # not retried: the schedule decides
    assert await store.jobs.complete_succeeded([(job.id, claimed.attempt)], "ghost") == set()  # fenced
    [run] = await runs(store, "p")
    assert (run["status"], run["worker_id"], run["scheduled_for"]) == ("abandoned", "ghost", tick.tick)
    assert await store.jobs.rescue_expired(3, 3, 100, lease_seconds=30) == []  # nothing left to take over


async def _called(factory: Recorder) -> bool:
    return factory.calls >= 1


async def serve_once_registered(pipeline: ScheduledPipeline, store: Store, settings: Settings) -> None:
    task = serving(pipeline, settings)
    await wait_until(lambda: _spec_is(store, pipeline), timeout=10)
    pipeline.stop()
    await asyncio.wait_for(task, 10)


async def _spec_is(store: Store, pipeline: ScheduledPipeline) -> bool:
    row = await store.schedules.get(pipeline.pipeline_id)
    return row is not None and row.schedule_spec == pipeline.schedule.spec


async def test_missed_cron_ticks_run_once_not_once_per_tick(store: Store, settings: Settings) -> None:
    factory = Recorder()
    schedule = Schedule.cron("* * * * *")
    pipeline = ScheduledPipeline(factory, schedule, "minutely")
    await serve_once_registered(pipeline, store, settings)
    async with store.connection() as connection:  # every worker was down for a day
        await connection.execute("UPDATE agora.schedules SET next_run_at = now() - interval '1 day'")
    await serve_until(ScheduledPipeline(factory, schedule, "minutely"), store, settings, lambda: _called(factory))
    await asyncio.sleep(0.5)
    assert factory.calls == 1
    row = await store.schedules.get("minutely")
    [run] = await runs(store, "minutely")
    assert row is not None and row.next_run_at is not None
    # the first tick after the run (by the database's clock), not one of the missed ones
    assert run["finished_at"] < row.next_run_at <= run["finished_at"] + timedelta(minutes=1)


def host_clock_behind(monkeypatch: pytest.MonkeyPatch, behind: timedelta) -> None:
    """The runner's host clock (``datetime.now``) runs ``behind`` the database's."""

    class HostClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return datetime.now(tz) - behind

    monkeypatch.setattr(scheduled_pipeline, "datetime", HostClock)
    monkeypatch.setattr(schedules, "datetime", HostClock)


async def test_a_host_clock_behind_the_database_does_not_move_the_first_cron_tick(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_clock_behind(monkeypatch, timedelta(seconds=90))
    factory = Recorder()
    registered_after = await store.database_now()
    await serve_once_registered(ScheduledPipeline(factory, Schedule.cron("* * * * *"), "minutely"), store, settings)
    row = await store.schedules.get("minutely")
    # the next minute after the database's now; by the host's clock, a tick already past: run at once
    assert (factory.calls, await runs(store, "minutely")) == (0, [])
    assert row is not None and row.next_run_at is not None
    assert registered_after < row.next_run_at <= registered_after + timedelta(minutes=1, seconds=5)


async def test_a_host_clock_behind_the_database_never_schedules_a_cron_tick_twice(
    store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that ends, by its host's clock, before its own tick (the host is behind the
    database) must not get that tick again: the next claim would hit the tick's unique key."""
    factory = Recorder()
    schedule = Schedule.cron("0 * * * *")  # hourly: the next tick cannot fall due within the test...
    started = datetime.now(UTC)
    if started.minute == 59 and started.second >= 45:  # ...but in the last seconds of an hour
        await asyncio.sleep(61 - started.second)

    host_clock_behind(monkeypatch, timedelta(hours=2))  # (before this hour's tick, whatever the minute)
    await serve_once_registered(ScheduledPipeline(factory, schedule, "hourly"), store, settings)  # not due yet
    async with store.connection() as connection:  # due now: this hour's tick, by the database clock
        tick = await connection.fetchval(
            "UPDATE agora.schedules SET next_run_at = date_trunc('hour', now()) RETURNING next_run_at"
        )
    again = ScheduledPipeline(factory, schedule, "hourly")
    task = serving(again, settings)
    await wait_until(lambda: _called(factory), timeout=10)
    await asyncio.sleep(1.0)  # a second claim would come now if the tick were due again
    assert not task.done()  # still serving: no UniqueViolation escaped
    again.stop()
    await asyncio.wait_for(task, 10)
    assert factory.calls == 1
    [run] = await runs(store, "hourly")
    assert (run["status"], run["scheduled_for"]) == ("succeeded", tick)
    row = await store.schedules.get("hourly")
    assert row is not None and row.next_run_at == tick + timedelta(hours=1)


async def test_a_run_failing_with_text_postgresql_cannot_hold_is_recorded(store: Store, settings: Settings) -> None:
    class Poisoned:
        async def run(self) -> None:
            raise ValueError("bad \x00 byte and \udc80 half a character")

    pipeline = ScheduledPipeline(lambda: Poisoned(), Schedule.every(hours=1), "poisoned", max_consecutive_errors=5)

    async def recorded() -> bool:
        row = await store.schedules.get("poisoned")
        return row is not None and row.consecutive_errors == 1

    await serve_until(pipeline, store, settings, recorded)
    [run] = await runs(store, "poisoned")
    assert run["status"] == "failed"
    assert run["error_message"] == "ValueError: bad \\x00 byte and \\udc80 half a character"
    async with store.connection() as connection:
        traceback = await connection.fetchval("SELECT traceback FROM agora.runs WHERE pipeline_id = 'poisoned'")
    assert "raise ValueError" in traceback


async def test_a_run_cut_short_at_shutdown_is_recorded_and_due_again_at_once(store: Store, settings: Settings) -> None:
    factory = Recorder(sleep=60)
    pool = WorkerPool(graceful_shutdown_timeout=0.2, settings=settings).register(
        ScheduledPipeline(factory, Schedule.every(hours=1), "long"))
    task = asyncio.create_task(pool.run(handle_signals=False))
    await wait_until(lambda: _running(store, "long"), timeout=10)
    pool.stop()
    await asyncio.wait_for(task, 15)
    [run] = await runs(store, "long")
    assert run["status"] == "cancelled" and run["error_message"].startswith("WorkerShutdown")
    row = await store.schedules.get("long")
    assert row is not None and row.job_id is None and row.consecutive_errors == 0  # not counted
    assert row.next_run_at is not None and row.next_run_at <= datetime.now(UTC)  # another worker may take it at once


async def http_get(url: str) -> tuple[int, dict[str, Any]]:
    def get() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    return await asyncio.to_thread(get)


async def test_a_pool_ends_when_a_pipeline_stops_and_again_at_a_restart(store: Store, settings: Settings) -> None:
    failing = Recorder(failures=100)

    def pool() -> WorkerPool:
        return WorkerPool(health_port=0, settings=settings).register(
            ScheduledPipeline(failing, Schedule.every(seconds=1), "doomed", error_backoff_seconds=0.01, max_consecutive_errors=2)
        ).register(ScheduledPipeline(Recorder(), Schedule.every(hours=1), "fine"))

    first = pool()
    with pytest.raises(PipelineFailed, match="pipeline 'doomed' stopped after 2 consecutive errors: RuntimeError: boom"):
        await asyncio.wait_for(first.run(handle_signals=False), 20)

    second = pool()  # a restart says the pipeline is stopped, and how to resume it, and ends
    with pytest.raises(ScheduleStopped, match="pipeline doomed: its schedule is stopped after 2 failed runs"):
        await asyncio.wait_for(second.run(handle_signals=False), 20)
    assert failing.calls == 2


async def _serving(pool: WorkerPool) -> bool:
    return pool.health is not None and all(p.status.state != "starting" for p in pool.pipelines)


async def test_pool_health_ready_200_when_all_is_well(store: Store, settings: Settings) -> None:
    pool = WorkerPool(health_port=0, settings=settings).register(
        ScheduledPipeline(Recorder(), Schedule.every(hours=1), "fine")
    )
    task = asyncio.create_task(pool.run(handle_signals=False))
    try:
        await wait_until(lambda: _serving(pool), timeout=10)
        assert pool.health is not None
        status, body = await http_get(f"http://127.0.0.1:{pool.health.port}/ready")
        assert status == 200 and body["status"] == "ready"
        assert body["pipelines"]["fine"]["state"] == "active"
    finally:
        pool.stop()
        await asyncio.wait_for(task, 15)


async def test_standalone_once_start_uses_the_environment_database(
    database_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the seed's one-shot sample: ScheduledPipeline(..., Schedule.once(), ...); await scheduled.start()
    monkeypatch.setenv("AGORA_PG_DATABASE_URL", database_url)
    factory = Recorder()
    scheduled = ScheduledPipeline(factory=factory, schedule=Schedule.once(), pipeline_id="backfill_2024")
    await asyncio.wait_for(scheduled.start(), 20)
    assert factory.calls == 1
    assert [run["status"] for run in await runs(store, "backfill_2024")] == ["succeeded"]


async def test_pool_stops_when_its_job_worker_cannot_start(store: Store, settings: Settings) -> None:
    import contextlib
    from collections.abc import AsyncIterator

    from agora_pg import Worker
    from agora_pg.runner import JobWorkerStopped

    @contextlib.asynccontextmanager
    async def broken_lifespan() -> AsyncIterator[None]:
        raise ConnectionError("mail server unreachable")
        yield  # pragma: no cover

    factory = Recorder()
    pool = WorkerPool(settings=settings).register(Worker({}, lifespan=broken_lifespan, settings=settings))
    pool.register(ScheduledPipeline(factory, Schedule.every(hours=1), "beside"))
    with pytest.raises(JobWorkerStopped, match="mail server unreachable"):
        await asyncio.wait_for(pool.run(handle_signals=False), 15)


async def test_trigger_and_resume_wake_a_sleeping_pipeline_at_once(store: Store, settings: Settings) -> None:
    recorder = Recorder()
    pool = WorkerPool(settings=settings).register(ScheduledPipeline(recorder, Schedule.every(hours=1), "hourly"))
    task = asyncio.create_task(pool.run(handle_signals=False))
    try:
        await wait_until(lambda: _count(recorder, 1), timeout=10)  # every() runs at start, then sleeps an hour
        await asyncio.sleep(0.5)  # asleep now, for up to MAX_IDLE_WAIT (30 s) without a notification
        await store.schedules.trigger("hourly")
        # (well inside the 30 s it would sleep: the trigger woke it)
        await wait_until(lambda: _count(recorder, 2), timeout=20)
        await wait_until(lambda: _idle(store, "hourly"), timeout=20)
        await store.schedules.pause("hourly")
        await store.schedules.resume("hourly")
        await store.schedules.trigger("hourly")
        await wait_until(lambda: _count(recorder, 3), timeout=20)
    finally:
        pool.stop()
        await asyncio.wait_for(task, 15)
    assert [row["status"] for row in await runs(store, "hourly")] == ["succeeded"] * 3


async def _count(recorder: Recorder, calls: int) -> bool:
    return recorder.calls >= calls and recorder.closed >= calls


async def _idle(store: Store, pipeline_id: str) -> bool:
    row = await store.schedules.get(pipeline_id)
    return row is not None and row.job_id is None


async def test_a_stop_that_comes_while_the_pool_starts_stops_its_pipeline_worker_too(settings: Settings) -> None:
    # (a pool stopped before it had built its pipeline worker left that worker claiming forever)
    pool = WorkerPool(settings=settings, graceful_shutdown_timeout=1.0)
    pool.register(ScheduledPipeline(Recorder(), Schedule.every(hours=1), "early_stop"))
    running = asyncio.create_task(pool.run(handle_signals=False))
    pool.stop()  # before the pool has started anything
    await asyncio.wait_for(running, 15)
