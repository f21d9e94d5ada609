"""Where pipeline records go: standard output, a JSON-lines file, a database table.

Guarantees when a run is killed and resumed from its checkpoint:

- ``DatabaseSink`` on the agora database: exactly once. Each batch's rows, its dead
  letters and the source position are one transaction.
- ``DatabaseSink`` on another database: at least once. The position is saved right
  after the batch commits; a crash in between writes that batch again.
- ``StdoutSink``, ``JsonlSink``: at least once (the batch in flight at the crash is
  written again); ``JsonlSink`` flushes and fsyncs each batch before the position moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import operator
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import IO, Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from agora_pg.db import queries
from agora_pg.db.connect import Database
from agora_pg.db.pipeline_state import Checkpoint, DeadLetter, write_batch_state
from agora_pg.db.store import Store
from agora_pg.pipelines.records import Record, Rejected, column_typer, to_json


# What a table (or the driver encoding for it) raises for rows it refuses: a batch that
# raises one is written again row by row, and the refused rows become dead letters.
REFUSED_ROW_ERRORS = (
    asyncpg.DataError, asyncpg.IntegrityConstraintViolationError, ValueError, TypeError, OverflowError,
)


@dataclasses.dataclass(frozen=True)
class BatchState:
    """What a sink on the agora database commits together with its rows."""

    pipeline_id: str
    checkpoint: Checkpoint | None
    dead_letters: list[DeadLetter]
    record_rejects: bool = True  # also store the rows this sink refuses in agora.dead_letters
    job_id: int | None = None  # the job of the run (None: a run outside any job)
    replayed: Sequence[int] = ()  # the dead letters this batch replays: marked with its rows


class Sink:
    """Base of the sinks. ``write`` returns the records it rejected; ``close`` flushes
    and releases what the sink holds."""

    @property
    def name(self) -> str:
        return type(self).__name__.removesuffix("Sink").lower()

    def commits_state_for(self, database: Database) -> bool:
        """True if this sink writes to ``database`` and so can commit batch state with its rows."""
        return False

    async def prepare(self, pipeline_id: str, store: Store) -> None:
        """Called before a run (or replay) writes: the pipeline's id and the agora database's Store."""
        return None

    async def write(self, records: Sequence[Record], state: BatchState | None = None) -> list[Rejected]:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class _LinesSink(Sink):
    def _lines(self, records: Sequence[Record]) -> tuple[list[str], list[Rejected]]:
        lines, rejected = [], []
        for record in records:
            try:
                lines.append(to_json(record) + "\n")
            except (TypeError, ValueError) as error:
                rejected.append(Rejected(f"sink:{self.name}", record, error))
        return lines, rejected


class StdoutSink(_LinesSink):
    """Each record as a line of JSON on standard output."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream

    async def write(self, records: Sequence[Record], state: BatchState | None = None) -> list[Rejected]:
        lines, rejected = self._lines(records)
        stream = self.stream or sys.stdout
        stream.write("".join(lines))
        stream.flush()
        return rejected


class JsonlSink(_LinesSink):
    """Each record as a line of JSON appended to ``path``; every batch is flushed and fsynced."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._handle: IO[str] | None = None

    async def write(self, records: Sequence[Record], state: BatchState | None = None) -> list[Rejected]:
        lines, rejected = self._lines(records)
        await asyncio.to_thread(self._append, "".join(lines))
        return rejected

    def _append(self, text: str) -> None:
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._handle.write(text)
        self._handle.flush()
        os.fsync(self._handle.fileno())

    async def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class DatabaseSink(Sink):
    """Rows into a table, a transaction per batch, with ``COPY`` (``mode="copy"``) or one
    INSERT per row (``mode="insert"``).

    ``database`` is what ``connect_db(url)`` returns, a URL, a SQLAlchemy engine, or an
    asyncpg connection or pool (used as given: the sink never closes it). ``table`` is
    ``"schema.table"`` or ``"table"`` (in ``public``); it defaults to the pipeline's id.
    Columns are the table's columns that the records carry, or ``columns``. Text values
    (a ``CsvSource`` without a schema) are typed from the table's column types; a value
    that does not convert, and every row the table refuses, becomes a dead letter (a
    refused batch is written again row by row, each row in a savepoint); the rest are kept.
    """

    def __init__(self, database: Any, table: str | None = None, *, columns: Sequence[str] | None = None,
                 mode: str = "copy") -> None:
        self.database: Database | None = None
        self._given: Any = None  # an asyncpg connection or pool of the caller's
        if isinstance(database, Database):
            self.database = database
        elif isinstance(database, str):
            self.database = Database(database)
        elif isinstance(database, asyncpg.Connection | asyncpg.Pool | PoolConnectionProxy):
            self._given = database
        elif hasattr(getattr(database, "url", None), "render_as_string"):  # a SQLAlchemy engine
            self.database = Database(database.url.render_as_string(hide_password=False))
        else:
            raise TypeError(
                "DatabaseSink(database): expected what connect_db(url) returns, a postgresql:// URL, "
                f"an asyncpg connection or pool, or a SQLAlchemy engine; got {type(database).__name__}"
            )
        if table is not None and (not isinstance(table, str) or not table.strip(".").strip()):
            raise ValueError(f"DatabaseSink(table=...): expected 'table' or 'schema.table', got {table!r}")
        self.schema: str = "public"
        self.table: str | None = None  # None until a pipeline gives its id
        if table is not None:
            self.schema, self.table = _split_table(table)
        if mode not in ("copy", "insert"):
            raise ValueError(f"mode must be 'copy' or 'insert', got {mode!r}")
        self.mode = mode
        self.columns = list(columns) if columns is not None else None
        self._connection: asyncpg.Connection | None = None  # the sink's own (from a URL)
        self._column_types: dict[str, str] | None = None  # the table's columns -> udt_name, in order
        self._typer: Callable[[Record], Record] | None = None
        self._on_agora_database: bool | None = None  # is it agora-pg's own database? (prepare)

    @property
    def name(self) -> str:
        return f"database:{self.schema}.{self.table or '(pipeline id)'}"

    def commits_state_for(self, database: Database) -> bool:
        if self._on_agora_database is not None:  # asked of the servers by prepare()
            return self._on_agora_database
        return self.database is not None and self.database.asyncpg_url == database.asyncpg_url

    async def prepare(self, pipeline_id: str, store: Store) -> None:
        if self.table is None:
            self.schema, self.table = _split_table(pipeline_id)
        if self._on_agora_database is None:  # (two URLs may name one database: ask the servers)
            async with self._connected() as connection:
                mine = tuple(await connection.fetchrow(queries.DATABASE_IDENTITY))
            self._on_agora_database = mine == await store.database_identity()

    async def write(self, records: Sequence[Record], state: BatchState | None = None) -> list[Rejected]:
        if self.table is None:
            raise LookupError("DatabaseSink: no table: give table=..., or use the sink in a pipeline "
                              "(whose id is the default table)")
        async with self._connected() as connection:
            columns = await self._columns(connection, records)
            kept, rows, unconverted = self._typed(records, columns)
            rejected = list(unconverted)
            try:
                async with connection.transaction():
                    await self._write_rows(connection, columns, rows)
                    await self._write_state(connection, state, rejected)
            except REFUSED_ROW_ERRORS:
                rejected = list(unconverted)
                async with connection.transaction():
                    for record, row in zip(kept, rows, strict=True):
                        try:
                            async with connection.transaction():  # a savepoint per row
                                await connection.execute(queries.insert_row(self.schema, self.table, columns), *row)
                        except REFUSED_ROW_ERRORS as error:
                            rejected.append(Rejected(f"sink:{self.name}", record, error))
                    await self._write_state(connection, state, rejected)
        return rejected

    def _typed(
        self, records: Sequence[Record], columns: list[str]
    ) -> tuple[Sequence[Record], list[tuple[Any, ...]], list[Rejected]]:
        """The records that convert to the table's types, their rows, and those that do not."""
        if self._typer is None:
            return records, _rows(records, columns), []
        kept: list[Record] = []
        typed: list[Record] = []
        rejected: list[Rejected] = []
        for record in records:
            try:
                typed.append(self._typer(record))
            except ValueError as error:
                rejected.append(Rejected(f"sink:{self.name}", record, error))
            else:
                kept.append(record)
        return kept, _rows(typed, columns), rejected

    async def _write_rows(self, connection: Any, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        assert self.table is not None
        if self.mode == "copy":
            await connection.copy_records_to_table(self.table, schema_name=self.schema, columns=columns, records=rows)
        else:
            await connection.executemany(queries.insert_row(self.schema, self.table, columns), rows)

    @staticmethod
    async def _write_state(connection: Any, state: BatchState | None, rejected: list[Rejected]) -> None:
        if state is None:
            return
        own = [dead_letter(item) for item in rejected] if state.record_rejects else []
        letters = state.dead_letters + own
        await write_batch_state(connection, state.pipeline_id, state.checkpoint, letters, state.job_id, state.replayed)

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[Any]:
        """The given connection, one of the given pool's, or the sink's own (kept open)."""
        if isinstance(self._given, asyncpg.Pool):
            async with self._given.acquire() as connection:
                yield connection
        elif self._given is not None:
            yield self._given
        else:
            assert self.database is not None
            if self._connection is None or self._connection.is_closed():
                self._connection = await asyncpg.connect(self.database.asyncpg_url, **self.database.connect_options)
            yield self._connection

    async def _columns(self, connection: Any, records: Sequence[Record]) -> list[str]:
        if self._column_types is None:
            rows = await connection.fetch(queries.TABLE_COLUMNS, self.schema, self.table)
            if not rows:
                where = self.database.display_url if self.database is not None else "the given connection's database"
                raise LookupError(f"table {self.schema}.{self.table} does not exist in {where}")
            self._column_types = {row["column_name"]: row["udt_name"] for row in rows}
            wanted = self.columns if self.columns is not None else list(self._column_types)
            self._typer = column_typer({c: self._column_types[c] for c in wanted if c in self._column_types})
        if self.columns is not None:
            return self.columns
        present = {key for record in records for key in record}
        return [column for column in self._column_types if column in present]

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None


def _split_table(name: str) -> tuple[str, str]:
    """``"schema.table"`` or ``"table"`` (in ``public``)."""
    schema, _, table = name.rpartition(".")
    return schema or "public", table


def _rows(records: Sequence[Record], columns: list[str]) -> list[tuple[Any, ...]]:
    """Each record's values in column order (None where a record lacks a column)."""
    if len(columns) > 1:
        pick = operator.itemgetter(*columns)
        try:
            return [pick(record) for record in records]  # all columns present: the fast way
        except KeyError:
            pass
    return [tuple(map(record.get, columns)) for record in records]


def dead_letter(item: Rejected) -> DeadLetter:
    """A rejected record as it is stored."""
    message = str(item.error) or type(item.error).__name__
    return DeadLetter(item.stage, item.record, type(item.error).__name__, message)
