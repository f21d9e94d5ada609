"""Which process claims a pipeline's tick first: pure, no I/O.

Every process that registers a pipeline may claim its ticks; when all of them ask for
every tick at the same moment, each claim statement competes with the others' for the
same rows and the server's cores (2,000 pipelines on 3 processes: p99 lag 60-160 ms).
So the live processes that run pipelines (``agora.workers.runs_pipelines`` with a live
lease) share them out by rendezvous hashing: a pipeline's first claimant is the peer
with the highest hash of (peer, pipeline). That claimant asks at the due moment; the
others ask ``FALLBACK_DELAY`` later, and find the tick taken, unless its claimant is gone
or does not register that pipeline. Nothing depends on the share for correctness: the
claim statement still decides, under its row lock, who runs a tick.

A peer that joins or leaves moves only its own share (rendezvous hashing), so the other
processes keep the pipelines they had.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

# How much later than the due moment a process asks for a tick another process claims
# first: long after that claim has committed (tens of ms), short enough that a tick whose
# claimant is gone (killed: its lease has not passed yet) or does not register the
# pipeline runs this late, not a lease later.
FALLBACK_DELAY = 0.5


def _score(peer: str, pipeline_id: str) -> int:
    digest = hashlib.blake2b(f"{peer}\0{pipeline_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class TickShares:
    """The share of the ticks of one process (``worker_id``) among ``peers``."""

    def __init__(self, worker_id: str, peers: Iterable[str] = ()) -> None:
        self.worker_id = worker_id
        self._peers: tuple[str, ...] = ()
        self._first: dict[str, bool] = {}  # pipeline id: this process claims its ticks first
        self.update(peers)

    @property
    def peers(self) -> tuple[str, ...]:
        """The processes sharing the ticks, this one included (sorted)."""
        return self._peers

    def update(self, peers: Iterable[str]) -> None:
        """New live peers (this process is always one of them)."""
        peers = tuple(sorted({*peers, self.worker_id}))
        if peers != self._peers:
            self._peers = peers
            self._first = {}

    def claims_first(self, pipeline_id: str) -> bool:
        """Whether this process asks for the pipeline's ticks at their due moment."""
        first = self._first.get(pipeline_id)
        if first is None:
            best = max(self._peers, key=lambda peer: _score(peer, pipeline_id))
            first = self._first[pipeline_id] = best == self.worker_id
        return first

    def claim_delay(self, pipeline_id: str) -> float:
        """Seconds after a tick's due moment this process asks for it: 0 or ``FALLBACK_DELAY``."""
        return 0.0 if self.claims_first(pipeline_id) else FALLBACK_DELAY
