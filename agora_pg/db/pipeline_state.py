"""What pipelines keep in the database: source checkpoints and dead letters."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from agora_pg.db import queries
from agora_pg.db.store import Store


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Where a pipeline's source resumes; ``source`` names the source that saved it."""

    position: Any
    source: str


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A record a step or sink rejected (``agora.dead_letters``)."""

    stage: str
    record: Any
    error_type: str
    error_message: str
    id: int | None = None
    pipeline_id: str | None = None
    run_id: int | None = None
    job_id: int | None = None
    created_at: datetime | None = None
    replayed_at: datetime | None = None


def checkpoint_args(pipeline_id: str, checkpoint: Checkpoint, job_id: int | None) -> tuple[Any, ...]:
    """Parameters of ``queries.SAVE_CHECKPOINT``."""
    return (pipeline_id, json.dumps(checkpoint.position), checkpoint.source, job_id)


def dead_letter_args(pipeline_id: str, letters: Sequence[DeadLetter], job_id: int | None) -> tuple[Any, ...]:
    """Parameters of ``queries.INSERT_DEAD_LETTERS``."""
    return (
        pipeline_id,
        job_id,
        [letter.stage for letter in letters],
        [json.dumps(letter.record, default=str) for letter in letters],
        [letter.error_type for letter in letters],
        [letter.error_message for letter in letters],
    )


async def write_batch_state(
    connection: asyncpg.Connection,
    pipeline_id: str,
    checkpoint: Checkpoint | None,
    letters: Sequence[DeadLetter],
    job_id: int | None,
    replayed: Sequence[int] = (),
) -> None:
    """Dead letters and the checkpoint of one batch, and the dead letters it replayed
    (marked), on ``connection`` (the caller's transaction: a database sink writes them
    with its rows, so a replay into it happens exactly once)."""
    if replayed:
        await connection.execute(queries.MARK_DEAD_LETTERS_REPLAYED, list(replayed))
    if letters:
        await connection.execute(queries.INSERT_DEAD_LETTERS, *dead_letter_args(pipeline_id, letters, job_id))
    if checkpoint is not None:
        await connection.execute(queries.SAVE_CHECKPOINT, *checkpoint_args(pipeline_id, checkpoint, job_id))


class PipelineState:
    """Checkpoints and dead letters through a Store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def checkpoint(self, pipeline_id: str) -> Checkpoint | None:
        rows = await self.store.fetch(queries.SELECT_CHECKPOINT, pipeline_id)
        return Checkpoint(json.loads(rows[0]["position"]), rows[0]["source"]) if rows else None

    async def write_batch_state(self, pipeline_id: str, checkpoint: Checkpoint | None, letters: Sequence[DeadLetter],
                                job_id: int | None, replayed: Sequence[int] = ()) -> None:
        if checkpoint is None and not letters and not replayed:
            return
        async with self.store.connection() as connection, connection.transaction():
            await write_batch_state(connection, pipeline_id, checkpoint, letters, job_id, replayed)

    async def dead_letters(self, pipeline_id: str | None, include_replayed: bool, limit: int) -> list[DeadLetter]:
        return [_dead_letter(row) for row in await self.store.fetch(queries.LIST_DEAD_LETTERS, pipeline_id,
                                                                      include_replayed, limit)]

    async def waiting_dead_letters(self, pipeline_id: str, limit: int) -> list[DeadLetter]:
        return [_dead_letter(row) for row in await self.store.fetch(queries.WAITING_DEAD_LETTERS, pipeline_id, limit)]


def _dead_letter(row: asyncpg.Record) -> DeadLetter:
    return DeadLetter(
        id=row["id"], pipeline_id=row["pipeline_id"], run_id=row["run_id"], job_id=row["job_id"], stage=row["stage"],
        record=json.loads(row["record"]), error_type=row["error_type"], error_message=row["error_message"],
        created_at=row["created_at"], replayed_at=row["replayed_at"],
    )
