"""Claims of due pipeline runs, many per statement, for all the pipelines of a process.

Each pipeline's loop asks for its own run when it wakes (``await claims.claim(...)``);
the asks that arrive while a claim statement is in flight go out together in the
next one. A thousand pipelines due at the same minute thus cost a handful of
statements, not a thousand (and not a thousand connections' turns in the pool).
"""

from __future__ import annotations

import asyncio
import dataclasses

from agora_pg.db.schedule_rows import ClaimedRun
from agora_pg.db.store import Store

MAX_BATCH = 1000  # pipelines per claim statement


@dataclasses.dataclass
class _Ask:
    pipeline_id: str
    spec: str
    answer: asyncio.Future[ClaimedRun | None]


class RunClaims:
    """The claimer of one worker id on one Store: one statement in flight at a time."""

    def __init__(self, store: Store, worker_id: str, lease_seconds: float) -> None:
        self._store = store
        self._worker_id = worker_id
        self._lease_seconds = lease_seconds
        self._asks: list[_Ask] = []
        self._sender: asyncio.Task[None] | None = None

    async def claim(self, pipeline_id: str, spec: str) -> ClaimedRun | None:
        """Claim the pipeline's due run (as ``Store.claim_pipeline_runs``), or None when it
        is not due, leased, or registered with another spec. Raises what the statement
        raised. Cancelling the caller leaves a claim that may have committed: the
        pipeline's next claim finds and settles it (a lost reply)."""
        ask = _Ask(pipeline_id, spec, asyncio.get_running_loop().create_future())
        self._asks.append(ask)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send(), name="pipeline-run-claims")
        return await asyncio.shield(ask.answer)

    async def _send(self) -> None:
        try:
            while self._asks:
                batch = self._next_batch()
                try:
                    claimed = await self._store.claim_pipeline_runs(
                        [(ask.pipeline_id, ask.spec) for ask in batch], self._worker_id, self._lease_seconds
                    )
                except Exception as error:  # each caller decides (a DatabaseUnavailable is retried)
                    for ask in batch:
                        if not ask.answer.done():
                            ask.answer.set_exception(error)
                            ask.answer.exception()  # (retrieved: a caller that gave up raises no warning)
                    continue
                except BaseException:
                    for ask in batch + self._asks:
                        ask.answer.cancel()
                    self._asks = []
                    raise
                for ask in batch:
                    if not ask.answer.done():
                        ask.answer.set_result(claimed.get(ask.pipeline_id))
        finally:
            self._sender = None

    def _next_batch(self) -> list[_Ask]:
        """The asks to send now: one per pipeline id (a second ask of the same id waits for
        the next statement), at most ``MAX_BATCH``."""
        batch: list[_Ask] = []
        later: list[_Ask] = []
        ids: set[str] = set()
        for ask in self._asks:
            if ask.pipeline_id in ids or len(batch) >= MAX_BATCH:
                later.append(ask)
            else:
                ids.add(ask.pipeline_id)
                batch.append(ask)
        self._asks = later
        return batch
