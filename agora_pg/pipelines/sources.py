"""Where pipeline records come from: an iterable, a CSV file, a SQL query."""

from __future__ import annotations

import asyncio
import csv
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import asyncpg

from agora_pg.db.connect import Database
from agora_pg.db.queries import quote_identifier
from agora_pg.pipelines.records import Batch, Record, Rejected, check_schema, typed


class Source:
    """Base of the sources: ``read(batch_size, resume_after)`` yields ``Batch``es.

    A resumable source gives each batch the position after it; a run resumes after
    the position its pipeline saved last (``agora.checkpoints``).
    """

    resumable = False

    @property
    def name(self) -> str:
        """Identifies the source in a checkpoint: a changed source starts over."""
        return type(self).__name__

    def read(self, batch_size: int, resume_after: Any = None) -> AsyncIterator[Batch]:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class IterableSource(Source):
    """Records from a list (or any iterable) of dicts; not resumable."""

    def __init__(self, records: Iterable[Mapping[str, Any]]) -> None:
        self.records = records

    async def read(self, batch_size: int, resume_after: Any = None) -> AsyncIterator[Batch]:
        batch: list[Record] = []
        for record in self.records:
            batch.append(dict(record))
            if len(batch) == batch_size:
                yield Batch(batch)
                batch = []
        if batch:
            yield Batch(batch)


class CsvSource(Source):
    """Rows of a CSV file with a header line, streamed; ``schema`` types columns
    (``{"id": "int", "amount": "decimal"}``; others stay text). Resumable: the
    position is the number of data rows read."""

    resumable = True

    def __init__(self, path: str | Path, schema: Mapping[str, str] | None = None, *, delimiter: str = ",",
                 encoding: str = "utf-8") -> None:
        self.path = Path(path)
        self.schema = check_schema(schema or {}, "schema")
        self.delimiter = delimiter
        self.encoding = encoding

    @property
    def name(self) -> str:
        return f"csv:{self.path}"

    async def read(self, batch_size: int, resume_after: Any = None) -> AsyncIterator[Batch]:
        skip = int(resume_after or 0)
        handle = await asyncio.to_thread(open, self.path, newline="", encoding=self.encoding)
        try:
            reader = csv.DictReader(handle, delimiter=self.delimiter)
            rows_read = await asyncio.to_thread(_skip, reader, skip)
            # Parsing and typing run in a thread, one batch ahead: the next batch is read
            # while the sinks write this one (COPY keeps the server busy meanwhile).
            upcoming = asyncio.ensure_future(asyncio.to_thread(_read_batch, reader, batch_size, self.schema))
            try:
                while True:
                    records, rejected, count = await upcoming
                    if count == 0:
                        return
                    rows_read += count
                    upcoming = asyncio.ensure_future(asyncio.to_thread(_read_batch, reader, batch_size, self.schema))
                    yield Batch(records, rows_read, rejected)
            finally:
                if not upcoming.done():
                    await asyncio.wait([upcoming])
        finally:
            handle.close()


def _skip(reader: csv.DictReader[str], count: int) -> int:
    for skipped in range(count):
        if next(reader, None) is None:
            return skipped
    return count


def _read_batch(
    reader: csv.DictReader[str], count: int, schema: Mapping[str, str]
) -> tuple[list[Record], list[Rejected], int]:
    """Up to ``count`` rows, typed; rows whose values do not convert are rejected."""
    records: list[Record] = []
    rejected: list[Rejected] = []
    taken = 0
    for row in reader:
        taken += 1
        row.pop(None, None)  # type: ignore[call-overload,unused-ignore]  # cells beyond the header
        try:
            records.append(typed(row, schema))
        except ValueError as error:
            rejected.append(Rejected("source:csv", row, error))
        if taken == count:
            break
    return records, rejected, taken


class SqlSource(Source):
    """Rows of a query, read through a server-side cursor, on the database at a URL (or
    what ``connect_db(url)`` returns). With ``key`` (a column the
    query returns, unique and ordered), rows come in key order and a run resumes
    after the last key saved."""

    def __init__(self, query: str, database_url: str | Database, *, key: str | None = None) -> None:
        self.query = query.strip().rstrip(";")
        self.database = database_url if isinstance(database_url, Database) else Database(database_url)
        self.key = key
        self.resumable = key is not None

    @property
    def name(self) -> str:
        return f"sql:{self.key}:{self.query}"

    async def read(self, batch_size: int, resume_after: Any = None) -> AsyncIterator[Batch]:
        statement, args = self._statement(resume_after)
        connection = await asyncpg.connect(self.database.asyncpg_url, **self.database.connect_options)
        try:
            async with connection.transaction(readonly=True):
                cursor = await connection.cursor(statement, *args)
                while rows := await cursor.fetch(batch_size):
                    records = [dict(row) for row in rows]
                    position = records[-1][self.key] if self.key is not None else None
                    yield Batch(records, _jsonable(position))
        finally:
            await connection.close()

    def _statement(self, resume_after: Any) -> tuple[str, list[Any]]:
        if self.key is None:
            return self.query, []
        key = quote_identifier(self.key)
        if resume_after is None:
            return f"SELECT * FROM ({self.query}) AS source ORDER BY {key}", []
        return f"SELECT * FROM ({self.query}) AS source WHERE {key} > $1 ORDER BY {key}", [resume_after]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
