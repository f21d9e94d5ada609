"""Which process claims a pipeline's tick first (rendezvous hashing; no database)."""

from __future__ import annotations

import collections

from agora_pg.runner.tick_shares import FALLBACK_DELAY, TickShares

PIPELINES = [f"pipeline-{n}" for n in range(3000)]
PEERS = ["host-a:101:aa", "host-b:202:bb", "host-c:303:cc"]


def first_claimants(peers: list[str]) -> dict[str, str]:
    """For each pipeline, the one peer that claims it first, checked to be exactly one."""
    shares = [TickShares(peer, peers) for peer in peers]
    claimants = {}
    for pipeline_id in PIPELINES:
        [first] = [share.worker_id for share in shares if share.claims_first(pipeline_id)]
        claimants[pipeline_id] = first
    return claimants


def test_a_process_alone_claims_every_tick_first() -> None:
    shares = TickShares("only")
    assert shares.peers == ("only",)
    assert all(shares.claim_delay(pipeline_id) == 0.0 for pipeline_id in PIPELINES[:100])


def test_each_tick_has_exactly_one_first_claimant_and_the_shares_are_even() -> None:
    counts = collections.Counter(first_claimants(PEERS).values())
    assert set(counts) == set(PEERS)
    assert all(800 <= count <= 1200 for count in counts.values()), counts  # 1,000 each on average


def test_the_others_ask_after_the_fallback_delay() -> None:
    claimants = first_claimants(PEERS)
    share = TickShares(PEERS[0], PEERS)
    for pipeline_id in PIPELINES[:200]:
        expected = 0.0 if claimants[pipeline_id] == PEERS[0] else FALLBACK_DELAY
        assert share.claim_delay(pipeline_id) == expected


def test_a_peer_that_leaves_moves_only_its_own_share() -> None:
    before = first_claimants(PEERS)
    after = first_claimants(PEERS[:2])
    moved = [pipeline_id for pipeline_id in PIPELINES if before[pipeline_id] != after[pipeline_id]]
    assert moved and all(before[pipeline_id] == PEERS[2] for pipeline_id in moved)
    assert len(moved) == sum(1 for claimant in before.values() if claimant == PEERS[2])


def test_a_process_is_always_one_of_its_peers_and_updates_take_effect() -> None:
    shares = TickShares("me", ["other"])
    assert shares.peers == ("me", "other")
    mine = {pipeline_id for pipeline_id in PIPELINES if shares.claims_first(pipeline_id)}
    assert 0 < len(mine) < len(PIPELINES)
    shares.update([])  # the other one stopped (or was never seen): every tick is this one's first
    assert shares.peers == ("me",)
    assert all(shares.claims_first(pipeline_id) for pipeline_id in PIPELINES)
