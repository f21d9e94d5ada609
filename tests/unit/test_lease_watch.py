"""What the lease supervisor says when it fences a lease that went unrenewed (no thread,
no database: its watch is called by hand)."""

from __future__ import annotations

import dataclasses
import logging
import time

import pytest

from agora_pg.db.connect import Database
from agora_pg.outcomes import StopReason
from agora_pg.runtime.leases import LeaseSupervisor


@dataclasses.dataclass(eq=False)
class Holder:
    description: str
    fence_at: float = 0.0
    stopped_for: tuple[StopReason, ...] = ()


@pytest.mark.parametrize(("unrenewed", "said"), [
    (24.0, "...s; stopping it before the lease expires"),
    (46.0, "...s; the lease had expired (this process was frozen or cut off): the attempt "
           "is given up, and another worker may have rescued the job"),
])
def test_a_fenced_lease_says_whether_it_had_expired(
    unrenewed: float, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor = LeaseSupervisor(Database("postgresql://nobody@127.0.0.1:1/none"), "w", 30.0)
    holder = Holder("job 7 (kind 'k', attempt 1)")
    supervisor.hold([holder], time.monotonic() - unrenewed)  # (as after a freeze of that long)
    with caplog.at_level(logging.ERROR, logger="agora_pg"):
        supervisor._watch()
    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith("job 7 (kind 'k', attempt 1): lease not renewed for ") and line.endswith(said.split("s; ")[1])
    seconds = float(line.split("renewed for ")[1].split("s;")[0])  # how long it really went unrenewed
    assert unrenewed <= seconds < unrenewed + 1, line
