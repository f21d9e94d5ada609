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
import dataclasses
import operator
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import asyncpg

from agora_pg.db import queries
from agora_pg.db.connect import Database
from agora_pg.db.pipeline_state import Checkpoint, DeadLetter, write_batch_state
from agora_pg.pipelines.records import Record, Rejected, to_json


# What a table (or the driver encoding for it) raises for rows it refuses: a batch that
# raises one is written again row by row, and the refused rows become dead letters.
REFUSED_ROW_ERRORS = (
    asyncpg.DataError, asyncpg.IntegrityConstraintViolationError, ValueError, TypeError, OverflowError,
)


@dataclasses.dataclass(frozen=True)
class BatchState:
    """What a sink on the agora database commits together with its rows."""

    pipeline_id: str
    run_id: int | None
    checkpoint: Checkpoint | None
    dead_letters: list[DeadLetter]
    record_rejects: bool = True  # also store the rows this sink refuses in agora.dead_letters


class Sink:
    """Base of the sinks. ``write`` returns the records it rejected; ``close`` flushes
    and releases what the sink holds."""

    @property
    def name(self) -> str:
        return type(self).__name__.removesuffix("Sink").lower()

    def commits_state_for(self, database: Database) -> bool:
        """True if this sink writes to ``database`` and so can commit batch state with its rows."""
        return False

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
    """Rows into ``table`` (``"schema.table"`` or ``"table"`` in ``public``), a
    transaction per batch, with ``COPY`` (``mode="copy"``) or one INSERT per row
    (``mode="insert"``). Columns are the table's columns that the records carry, or
    ``columns``. A batch the table refuses is written again row by row, each row in a
    savepoint: the rows it refuses become dead letters, the rest are kept."""

    def __init__(self, database: str | Any, table: str, *, columns: Sequence[str] | None = None,
                 mode: str = "copy") -> None:
        url = database if isinstance(database, str) else database.url.render_as_string(hide_password=False)
        self.database = Database(url)
        self.schema, _, self.table = table.rpartition(".")
        self.schema = self.schema or "public"
        if mode not in ("copy", "insert"):
            raise ValueError(f"mode must be 'copy' or 'insert', got {mode!r}")
        self.mode = mode
        self.columns = list(columns) if columns is not None else None
        self._connection: asyncpg.Connection | None = None
        self._table_columns: list[str] | None = None

    @property
    def name(self) -> str:
        return f"database:{self.schema}.{self.table}"

    def commits_state_for(self, database: Database) -> bool:
        return self.database.asyncpg_url == database.asyncpg_url

    async def write(self, records: Sequence[Record], state: BatchState | None = None) -> list[Rejected]:
        connection = await self._connect()
        columns = await self._columns(connection, records)
        rows = _rows(records, columns)
        rejected: list[Rejected] = []
        try:
            async with connection.transaction():
                await self._write_rows(connection, columns, rows)
                await self._write_state(connection, state, rejected)
        except REFUSED_ROW_ERRORS:
            rejected = []
            async with connection.transaction():
                for record, row in zip(records, rows, strict=True):
                    try:
                        async with connection.transaction():  # a savepoint per row
                            await connection.execute(queries.insert_row(self.schema, self.table, columns), *row)
                    except REFUSED_ROW_ERRORS as error:
                        rejected.append(Rejected(f"sink:{self.name}", record, error))
                await self._write_state(connection, state, rejected)
        return rejected

    async def _write_rows(self, connection: asyncpg.Connection, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        if self.mode == "copy":
            await connection.copy_records_to_table(self.table, schema_name=self.schema, columns=columns, records=rows)
        else:
            await connection.executemany(queries.insert_row(self.schema, self.table, columns), rows)

    @staticmethod
    async def _write_state(connection: asyncpg.Connection, state: BatchState | None, rejected: list[Rejected]) -> None:
        if state is None:
            return
        own = [dead_letter(item) for item in rejected] if state.record_rejects else []
        letters = state.dead_letters + own
        await write_batch_state(connection, state.pipeline_id, state.run_id, state.checkpoint, letters)

    async def _connect(self) -> asyncpg.Connection:
        if self._connection is None or self._connection.is_closed():
            self._connection = await asyncpg.connect(self.database.asyncpg_url)
        return self._connection

    async def _columns(self, connection: asyncpg.Connection, records: Sequence[Record]) -> list[str]:
        if self.columns is not None:
            return self.columns
        if self._table_columns is None:
            rows = await connection.fetch(queries.TABLE_COLUMNS, self.schema, self.table)
            if not rows:
                raise LookupError(f"table {self.schema}.{self.table} does not exist in {self.database.display_url}")
            self._table_columns = [row["column_name"] for row in rows]
        present = {key for record in records for key in record}
        return [column for column in self._table_columns if column in present]

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None


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
