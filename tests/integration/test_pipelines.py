"""Pipelines against real files and a real database: sources, sinks, steps,
checkpoints, dead letters and spans."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agora_pg.db.pipeline_state import PipelineState
from agora_pg.db.store import Store
from agora_pg.pipelines import (
    CsvSource,
    DatabaseSink,
    IterableSource,
    JsonlSink,
    Pipeline,
    SqlSource,
    StdoutSink,
    TooManyDeadLetters,
    Tracing,
)
from agora_pg.pipelines.pipeline import PipelineRun, current_run
from agora_pg.runner import PipelineFailed, Schedule, ScheduledPipeline, WorkerPool


EVENTS = "CREATE TABLE public.events (id int PRIMARY KEY, amount numeric NOT NULL CHECK (amount >= 0), note text)"


@contextlib.contextmanager
def in_run(store: Store) -> Iterator[None]:
    token = current_run.set(PipelineRun(store))
    try:
        yield
    finally:
        current_run.reset(token)


def write_csv(path: Path, rows: list[tuple[object, ...]], header: tuple[str, ...] = ("id", "amount", "note")) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as handle:
        writer = csv.writer(handle)
        if new:
            writer.writerow(header)
        writer.writerows(rows)


async def fetch(store: Store, sql: str, *args: object) -> list[asyncpg.Record]:
    async with store.connection() as connection:
        return list(await connection.fetch(sql, *args))


async def test_iterable_through_steps_into_stdout_and_jsonl(store: Store, tmp_path: Path) -> None:
    stream = io.StringIO()
    out = tmp_path / "out" / "records.jsonl"
    built = (
        Pipeline(IterableSource([{"n": i} for i in range(10)]), id="numbers", batch_size=3)
        .filter(lambda record: record["n"] % 2 == 0)
        .map(lambda record: {**record, "square": record["n"] ** 2})
        .build(StdoutSink(stream), JsonlSink(out))
    )
    with in_run(store):
        report = await built.run()
        await built.close()
    expected = [{"n": n, "square": n * n} for n in range(0, 10, 2)]
    assert [json.loads(line) for line in stream.getvalue().splitlines()] == expected
    assert [json.loads(line) for line in out.read_text().splitlines()] == expected
    assert (report.batches, report.read, report.passed, report.dead_letters) == (4, 10, 5, 0)


async def test_csv_into_the_database_resumes_after_its_checkpoint(store: Store, tmp_path: Path) -> None:
    await fetch(store, EVENTS)
    path = tmp_path / "events.csv"
    write_csv(path, [(i, f"{i}.50", f"note {i}") for i in range(1, 251)])

    def build() -> object:
        return Pipeline(CsvSource(path, {"id": "int", "amount": "decimal"}), id="events", batch_size=100).build(
            DatabaseSink(store.database.url, "public.events"))

    with in_run(store):
        first = build()
        report = await first.run()  # type: ignore[attr-defined]
        await first.close()  # type: ignore[attr-defined]
        assert (report.read, report.resumed_after) == (250, None)
        again = build()
        assert (await again.run()).read == 0  # type: ignore[attr-defined]
        await again.close()  # type: ignore[attr-defined]
        write_csv(path, [(i, "1", None) for i in range(251, 261)])
        more = build()
        report = await more.run()  # type: ignore[attr-defined]
        await more.close()  # type: ignore[attr-defined]
    assert (report.read, report.resumed_after) == (10, 250)
    rows = await fetch(store, "SELECT count(*) AS n, sum(amount) AS total FROM public.events")
    assert rows[0]["n"] == 260
    checkpoint = await PipelineState(store).checkpoint("events")
    assert checkpoint is not None and checkpoint.position == 260 and checkpoint.source == f"csv:{path}"


async def test_rows_the_table_refuses_become_dead_letters_and_the_rest_is_kept(store: Store, tmp_path: Path) -> None:
    await fetch(store, EVENTS)
    path = tmp_path / "events.csv"
    write_csv(path, [(1, "5", "ok"), (2, "-1", "negative"), (3, "oops", "not a number"), (4, "7", "ok"), (1, "9", "dup")])
    built = Pipeline(CsvSource(path, {"id": "int", "amount": "decimal"}), id="events").build(
        DatabaseSink(store.database.url, "public.events", mode="insert"))
    with in_run(store):
        report = await built.run()
        await built.close()
    assert report.dead_letters == 3
    assert [row["id"] for row in await fetch(store, "SELECT id FROM public.events ORDER BY id")] == [1, 4]
    letters = sorted(await PipelineState(store).dead_letters("events", False, 10), key=lambda letter: str(letter.record))
    assert {letter.stage for letter in letters} == {"source:csv", "sink:database:public.events"}
    assert {letter.error_type for letter in letters} == {"ValueError", "CheckViolationError", "UniqueViolationError"}
    bad_amount = next(letter for letter in letters if letter.stage == "source:csv")
    assert bad_amount.record == {"id": "3", "amount": "oops", "note": "not a number"}
    assert "column 'amount': expected decimal" in bad_amount.error_message


async def test_step_errors_are_dead_letters_up_to_the_limit(store: Store) -> None:
    def parse(record: dict[str, object]) -> dict[str, object]:
        return {"value": int(str(record["raw"]))}

    records = [{"raw": "1"}, {"raw": "x"}, {"raw": "2"}, {"raw": "y"}, {"raw": "z"}]
    stream = io.StringIO()
    built = Pipeline(IterableSource(records), id="parse", max_dead_letters=2).map(parse).build(StdoutSink(stream))
    with in_run(store), pytest.raises(TooManyDeadLetters, match="3 records rejected"):
        await built.run()
    letters = await PipelineState(store).dead_letters("parse", False, 10)
    assert sorted(letter.record["raw"] for letter in letters) == ["x", "y", "z"]
    assert {letter.stage for letter in letters} == {"map:parse"}
    assert stream.getvalue().splitlines() == ['{"value":1}', '{"value":2}']


async def test_dead_letters_replay_through_steps_and_sinks(store: Store) -> None:
    await fetch(store, EVENTS)
    fixed = {"ok": False}

    def check(record: dict[str, object]) -> dict[str, object]:
        if record["id"] == 2 and not fixed["ok"]:
            raise RuntimeError("not yet")
        return record

    def build() -> object:
        return Pipeline(IterableSource([{"id": 1, "amount": 1}, {"id": 2, "amount": 2}]), id="replayed").map(check).build(
            DatabaseSink(store.database.url, "public.events"))

    with in_run(store):
        first = build()
        await first.run()  # type: ignore[attr-defined]
        await first.close()  # type: ignore[attr-defined]
        state = PipelineState(store)
        waiting = await state.waiting_dead_letters("replayed", 10)
        assert [letter.record for letter in waiting] == [{"id": 2, "amount": 2}]
        fixed["ok"] = True
        second = build()
        again = await second.replay(waiting)  # type: ignore[attr-defined]
        await second.close()  # type: ignore[attr-defined]
    assert again == []
    assert [row["id"] for row in await fetch(store, "SELECT id FROM public.events ORDER BY id")] == [1, 2]


async def test_a_replay_into_agoras_database_marks_its_letters_with_its_rows(store: Store) -> None:
    """Exactly once: the replayed rows and the mark of their letters commit together. A
    replay whose mark fails (a trigger stands for a connection lost at that moment) writes
    no row; the next replay writes each id once."""
    await fetch(store, EVENTS)
    fixed = {"ok": False}

    def check(record: dict[str, object]) -> dict[str, object]:
        if not fixed["ok"] and record["id"] != 1:
            raise RuntimeError("not yet")
        return record

    def build() -> object:
        source = IterableSource([{"id": i, "amount": i} for i in range(1, 51)])
        return Pipeline(source, id="once").map(check).build(DatabaseSink(store.database.url, "public.events"))

    with in_run(store):
        first = build()
        await first.run()  # type: ignore[attr-defined]
        await first.close()  # type: ignore[attr-defined]
        waiting = await PipelineState(store).waiting_dead_letters("once", 100)
        assert len(waiting) == 49
        fixed["ok"] = True
        await fetch(store, "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS "
                           "$$ BEGIN RAISE EXCEPTION 'the connection is gone'; END $$")
        await fetch(store, "CREATE TRIGGER refuse BEFORE UPDATE ON agora.dead_letters "
                           "FOR EACH STATEMENT EXECUTE FUNCTION public.refuse()")
        broken = build()
        with pytest.raises(asyncpg.RaiseError, match="the connection is gone"):
            await broken.replay(waiting)  # type: ignore[attr-defined]
        await broken.close()  # type: ignore[attr-defined]
        assert [row["id"] for row in await fetch(store, "SELECT id FROM public.events")] == [1]
        assert len(await PipelineState(store).waiting_dead_letters("once", 100)) == 49
        await fetch(store, "DROP TRIGGER refuse ON agora.dead_letters")
        again = build()
        assert await again.replay(await PipelineState(store).waiting_dead_letters("once", 100)) == []  # type: ignore[attr-defined]
        await again.close()  # type: ignore[attr-defined]
    ids = [row["id"] for row in await fetch(store, "SELECT id FROM public.events ORDER BY id")]
    assert ids == list(range(1, 51))
    assert await PipelineState(store).waiting_dead_letters("once", 100) == []


async def test_a_replay_types_a_sources_reject_again(store: Store, tmp_path: Path) -> None:
    """A row the CSV source's schema refused is typed again when replayed: with nothing
    fixed the source rejects it again (before, it went to the sinks as text)."""
    await fetch(store, EVENTS)
    path = tmp_path / "events.csv"
    write_csv(path, [(1, "1", None), (2, "two", None)])

    def build(schema: dict[str, str]) -> object:
        return Pipeline(CsvSource(path, schema), id="typed").build(DatabaseSink(store.database.url, "public.events"))

    with in_run(store):
        first = build({"id": "int", "amount": "int"})
        await first.run()  # type: ignore[attr-defined]
        await first.close()  # type: ignore[attr-defined]
        [letter] = await PipelineState(store).waiting_dead_letters("typed", 10)
        assert (letter.stage, letter.record) == ("source:csv", {"id": "2", "amount": "two", "note": ""})
        again = build({"id": "int", "amount": "int"})
        [rejected] = await again.replay([letter])  # type: ignore[attr-defined]
        await again.close()  # type: ignore[attr-defined]
    assert rejected.stage == "source:csv" and "amount" in str(rejected.error)
    assert [row["id"] for row in await fetch(store, "SELECT id FROM public.events ORDER BY id")] == [1]


async def test_sql_source_resumes_after_its_key(store: Store) -> None:
    await fetch(store, "CREATE TABLE public.source_rows (id int PRIMARY KEY, name text)")
    await fetch(store, "INSERT INTO public.source_rows SELECT i, 'row ' || i FROM generate_series(1, 25) i")
    out = io.StringIO()

    async def run_once() -> int:
        built = Pipeline(SqlSource("SELECT id, name FROM public.source_rows", store.database.url, key="id"),
                         id="rows", batch_size=10).build(StdoutSink(out))
        with in_run(store):
            report = await built.run()
            await built.close()
        return report.read

    assert await run_once() == 25
    await fetch(store, "INSERT INTO public.source_rows VALUES (26, 'late'), (27, 'later')")
    assert await run_once() == 2
    ids = [json.loads(line)["id"] for line in out.getvalue().splitlines()]
    assert ids == list(range(1, 28))


async def test_a_sink_on_another_database_saves_the_checkpoint_after_the_batch(store: Store, tmp_path: Path) -> None:
    await fetch(store, EVENTS)
    path = tmp_path / "events.csv"
    write_csv(path, [(i, "1", None) for i in range(1, 6)])
    other_url = store.database.url + ("&" if "?" in store.database.url else "?") + "application_name=elsewhere"
    sink = DatabaseSink(other_url, "events")
    assert not sink.commits_state_for(store.database)
    built = Pipeline(CsvSource(path, {"id": "int", "amount": "int"}), id="elsewhere").build(sink)
    with in_run(store):
        await built.run()
        await built.close()
    checkpoint = await PipelineState(store).checkpoint("elsewhere")
    assert checkpoint is not None and checkpoint.position == 5


async def serve(pipeline: ScheduledPipeline, settings: object) -> None:
    """Run ``pipeline`` in a WorkerPool of its own until it ends."""
    await WorkerPool(settings=settings).register(pipeline).run(handle_signals=False)  # type: ignore[arg-type]


async def test_scheduled_pipeline_records_run_ids_and_spans(store: Store, settings: object) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer_before = trace.get_tracer_provider()
    trace._TRACER_PROVIDER = provider  # type: ignore[attr-defined]  # this test's provider, restored below
    try:
        async def factory() -> object:
            return (Pipeline(IterableSource([{"n": 1}, {"n": "bad"}]), id="traced", tracing=Tracing(service_name="t"))
                    .map(lambda record: {"n": int(record["n"])}, name="to_int").build(StdoutSink(io.StringIO())))

        scheduled = ScheduledPipeline(factory, Schedule.once(), "traced")
        await asyncio.wait_for(serve(scheduled, settings), 15)
    finally:
        trace._TRACER_PROVIDER = tracer_before  # type: ignore[attr-defined]
    [run] = await fetch(store, "SELECT job_id, status, progress::text FROM agora.runs WHERE pipeline_id = 'traced'")
    assert run["status"] == "succeeded"
    progress = json.loads(run["progress"])  # written by the run without any code of the pipeline's
    assert (progress["read"], progress["written"], progress["rejected"]) == (2, 1, 1)
    [letter] = await PipelineState(store).dead_letters("traced", False, 10)
    assert (letter.job_id, letter.stage) == (run["job_id"], "map:to_int")
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"pipeline.run", "pipeline.batch"}
    assert spans["pipeline.run"].attributes["agora.job_id"] == run["job_id"]
    assert spans["pipeline.run"].attributes["records.dead_letters"] == 1
    assert spans["pipeline.batch"].attributes["records.read"] == 2


async def test_without_tracing_no_opentelemetry_is_needed(store: Store) -> None:
    import subprocess
    import sys

    probe = (
        "import sys, asyncio\n"
        "from agora_pg.pipelines import Pipeline, IterableSource, StdoutSink\n"
        "built = Pipeline(IterableSource([{'a': 1}]), id='p').build(StdoutSink())\n"
        "print('opentelemetry' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


async def test_a_stopping_worker_ends_a_resumable_run_after_its_batch(store: Store, settings: object, tmp_path: Path) -> None:
    await fetch(store, EVENTS)
    path = tmp_path / "events.csv"
    write_csv(path, [(i, "1", None) for i in range(1, 10_001)])
    scheduled: list[ScheduledPipeline] = []

    def stop_at_2500(record: dict[str, object]) -> dict[str, object]:
        if record["id"] == 2500:
            scheduled[0].stop()  # as SIGTERM would, in the middle of the third batch
        return record

    async def factory() -> object:
        return (Pipeline(CsvSource(path, {"id": "int", "amount": "int"}), id="events", batch_size=1000)
                .map(stop_at_2500).build(DatabaseSink(store.database.url, "public.events")))

    scheduled.append(ScheduledPipeline(factory, Schedule.once(), "events"))
    await asyncio.wait_for(serve(scheduled[0], settings), 15)
    assert (await fetch(store, "SELECT count(*) AS n FROM public.events"))[0]["n"] == 3000
    [run] = await fetch(store, "SELECT status FROM agora.runs WHERE pipeline_id = 'events'")
    assert run["status"] == "cancelled"
    row = await store.schedules.get("events")
    assert row is not None and row.state == "active" and row.job_id is None

    async def finish() -> object:
        return Pipeline(CsvSource(path, {"id": "int", "amount": "int"}), id="events", batch_size=1000).build(
            DatabaseSink(store.database.url, "public.events"))

    await asyncio.wait_for(serve(ScheduledPipeline(finish, Schedule.once(), "events"), settings), 15)
    assert (await fetch(store, "SELECT count(*) AS n, count(DISTINCT id) AS d FROM public.events"))[0]["d"] == 10_000
    statuses = [r["status"] for r in await fetch(store, "SELECT status FROM agora.runs WHERE pipeline_id = 'events' ORDER BY id")]
    assert statuses == ["cancelled", "succeeded"]


async def test_database_sink_takes_an_engine_and_lines_sinks_reject_what_json_cannot_hold(
    store: Store, tmp_path: Path
) -> None:
    await fetch(store, EVENTS)
    out = tmp_path / "out.jsonl"
    records = [{"id": 1, "amount": 1, "note": "plain"}, {"id": 2, "amount": 2, "note": "tagged"}]
    built = (Pipeline(IterableSource(records), id="mixed")
             .map(lambda record: {**record, "tags": {"a"}} if record["note"] == "tagged" else record, name="tag")
             .build(JsonlSink(out), DatabaseSink(store.engine, "public.events", columns=["id", "amount", "note"])))
    with in_run(store):
        report = await built.run()
        await built.close()
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [1]
    assert [row["id"] for row in await fetch(store, "SELECT id FROM public.events ORDER BY id")] == [1, 2]
    [letter] = await PipelineState(store).dead_letters("mixed", False, 10)
    assert (letter.stage, letter.error_type) == ("sink:jsonl", "TypeError")
    assert report.dead_letters == 1


TYPED = ("CREATE TABLE public.events_ingest (id int PRIMARY KEY, name text, amount numeric, "
         "at timestamptz, active bool, day date)")


async def test_database_sink_takes_every_handle_and_defaults_to_the_pipeline_id(
    store: Store, database_url: str, tmp_path: Path
) -> None:
    from agora_pg import connect_db

    await fetch(store, TYPED)
    connection = await asyncpg.connect(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        handles = [await connect_db(database_url), database_url, store.engine, connection, pool]
        for number, handle in enumerate(handles, start=1):
            sink = DatabaseSink(handle)
            built = Pipeline(IterableSource([{"id": number, "name": f"via {type(handle).__name__}"}]),
                             id="events_ingest").build(sink)
            with in_run(store):
                report = await built.run()
                await built.close()
            assert (report.written, report.dead_letters) == (1, 0)
            assert sink.name == "database:public.events_ingest"
            assert sink.commits_state_for(store.database)  # all on the agora database: one transaction
        assert not connection.is_closed()  # a given connection is the caller's to close
    finally:
        await connection.close()
        await pool.close()
    names = [row["name"] for row in await fetch(store, "SELECT name FROM public.events_ingest ORDER BY id")]
    assert names == ["via Database", "via str", "via AsyncEngine", "via Connection", "via Pool"]

    with pytest.raises(TypeError, match="expected what connect_db\\(url\\) returns, .* got int"):
        DatabaseSink(42)
    with pytest.raises(ValueError, match="expected 'table' or 'schema.table'"):
        DatabaseSink(database_url, "")
    from agora_pg.errors import DatabaseUnavailable
    with pytest.raises(DatabaseUnavailable, match="cannot connect to postgresql://postgres@127.0.0.1:1/x"):
        await connect_db("postgresql://postgres@127.0.0.1:1/x")


async def test_a_given_connection_to_another_database_is_not_the_agora_database(
    store: Store, fresh_db: str
) -> None:
    other = await asyncpg.connect(fresh_db)
    try:
        await other.execute("CREATE TABLE public.copied (id int)")
        sink = DatabaseSink(other, "copied")
        await sink.prepare("copied", store)
        assert not sink.commits_state_for(store.database)
        built = Pipeline(IterableSource([{"id": 1}, {"id": 2}]), id="copied").build(sink)
        with in_run(store):
            assert (await built.run()).written == 2
        assert await other.fetchval("SELECT count(*) FROM public.copied") == 2
    finally:
        await other.close()


async def test_csv_text_is_typed_from_the_table_and_what_does_not_fit_is_a_dead_letter(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await fetch(store, TYPED)
    path = tmp_path / "events.csv"
    write_csv(path, [
        (1, "ada", "12.50", "2026-01-02T03:04:05+00:00", "yes", "2026-01-02"),
        (2, "bob", "", "", "", ""),
        ("three", "carol", "1", "2026-01-02T03:04:05+00:00", "no", "2026-01-02"),
    ], header=("id", "name", "amount", "at", "active", "day"))
    built = Pipeline(CsvSource(path), id="events_ingest").build(DatabaseSink(store.database.url))
    with in_run(store), caplog.at_level("INFO", logger="agora_pg.pipelines"):
        report = await built.run()
        await built.close()
    assert (report.read, report.written, report.dead_letters) == (3, 2, 1)
    assert "pipeline events_ingest: 3 records read, 2 written, 1 dead-lettered (1 batches)" in caplog.text
    rows = await fetch(store, "SELECT * FROM public.events_ingest ORDER BY id")
    assert [tuple(row) for row in rows][1] == (2, "bob", None, None, None, None)
    assert str(rows[0]["amount"]) == "12.50" and rows[0]["active"] is True and rows[0]["at"].year == 2026
    [letter] = await PipelineState(store).dead_letters("events_ingest", False, 10)
    assert letter.record["id"] == "three" and "column 'id': expected integer, got 'three'" in letter.error_message


async def test_a_run_that_dead_letters_everything_fails(store: Store, settings: object, tmp_path: Path) -> None:
    from agora_pg.pipelines import NothingWritten

    await fetch(store, TYPED)
    path = tmp_path / "events.csv"
    write_csv(path, [("x", "a"), ("y", "b"), ("z", "c")], header=("id", "name"))

    async def factory() -> object:
        return Pipeline(CsvSource(path), id="events_ingest").build(DatabaseSink(store.database.url))

    with in_run(store), pytest.raises(NothingWritten, match="every record went to the dead letters \\(3 of 3"):
        await (await factory()).run()  # type: ignore[attr-defined]
    await fetch(store, "DELETE FROM agora.checkpoints")
    scheduled = ScheduledPipeline(factory, Schedule.every(hours=1), "events_ingest", max_consecutive_errors=1)
    with pytest.raises(PipelineFailed) as failed:
        await asyncio.wait_for(serve(scheduled, settings), 15)
    assert isinstance(failed.value.error, NothingWritten)
    [run] = await fetch(store, "SELECT status, error_type, error_message FROM agora.runs WHERE pipeline_id = 'events_ingest'")
    assert (run["status"], run["error_type"]) == ("failed", "NothingWritten")
    assert "column 'id': expected integer" in run["error_message"]
