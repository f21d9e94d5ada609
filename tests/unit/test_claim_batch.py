"""How many jobs one claim takes, by concurrency. No database."""

from agora_pg.worker.worker import PIPELINED_ABOVE, claim_batch


def test_up_to_the_threshold_a_claim_takes_every_free_slot() -> None:
    assert [claim_batch(c) for c in (1, 2, 10, 50, PIPELINED_ABOVE)] == [1, 2, 10, 50, PIPELINED_ABOVE]


def test_above_it_a_claim_takes_half_the_slots_but_never_fewer_than_the_threshold() -> None:
    assert claim_batch(500) == 250
    assert claim_batch(501) == 251
    assert claim_batch(150) == PIPELINED_ABOVE
    assert claim_batch(PIPELINED_ABOVE + 1) == PIPELINED_ABOVE
