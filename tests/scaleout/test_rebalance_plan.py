"""The rebalance plan when a market is held by more than one replica: the newest copy wins, never an older one."""

from __future__ import annotations

from cerebellar_norse.scaleout.haproxy import Replica
from cerebellar_norse.scaleout.rebalance import Move, make_plan
from cerebellar_norse.scaleout.ring import Ring

R1, R2 = Replica(1, "127.0.0.1", 8081), Replica(2, "127.0.0.1", 8082)


def market_of(owner: int) -> str:
    return next(m for m in (f"M{k}" for k in range(1000)) if Ring({1: 1, 2: 1}).owner(m) == owner)


def test_an_older_copy_on_another_replica_is_never_moved_over_the_owners_state() -> None:
    # A failover served the market on r2 from rest while r1 restarted; r1 has it again since, with newer ticks.
    m = market_of(1)
    plan = make_plan([R1, R2], [R1, R2], {R1.url: {m: (1_700_000_012_000, 36)}, R2.url: {m: (1_700_000_006_500, 13)}})
    assert plan.moves == [] and plan.markets == 1
    assert plan.stale == [{"market_id": m, "replica": R2.url, "newest_at": R1.url}]


def test_a_frozen_copy_left_at_the_source_does_not_replace_the_moved_state() -> None:
    # A run that stopped after the switch: r2 serves the market, r1 still holds its frozen copy.
    m = market_of(2)
    plan = make_plan([R1, R2], [R1, R2], {R1.url: {m: (1_700_000_055_250, 222)}, R2.url: {m: (1_700_000_399_000, 1597)}})
    assert plan.moves == [] and [s["replica"] for s in plan.stale] == [R1.url]


def test_the_newest_copy_moves_to_the_owner() -> None:
    m = market_of(1)
    plan = make_plan([R1, R2], [R1], {R1.url: {m: (5, 1)}, R2.url: {m: (9, 4)}})
    assert plan.moves == [Move(m, R2.url, R1.url)] and plan.stale == [{"market_id": m, "replica": R1.url, "newest_at": R2.url}]


def test_markets_held_once_move_to_their_owner() -> None:
    m1, m2 = market_of(1), market_of(2)
    plan = make_plan([R1], [R1, R2], {R1.url: {m1: (5, 1), m2: (7, 2)}})
    assert plan.moves == [Move(m2, R1.url, R2.url)] and plan.stale == [] and plan.markets == 2


def test_equal_copies_left_by_an_interrupted_run_keep_the_owners_and_release_the_frozen_one() -> None:
    # A run imported the market at r1 (its new owner) and stopped before the switch: r2 holds the same state, frozen.
    m = market_of(1)
    holdings = {R1.url: {m: (1_700_000_055_250, 222)}, R2.url: {m: (1_700_000_055_250, 222)}}
    plan = make_plan([R1, R2], [R1, R2], holdings, {R2.url: {m}})
    assert plan.moves == [] and plan.releases == [{"market_id": m, "replica": R2.url}] and plan.thaws == []
    # whatever the order the replicas are listed in
    plan = make_plan([R2, R1], [R1, R2], dict(reversed(holdings.items())), {R2.url: {m}})
    assert plan.moves == [] and plan.releases == [{"market_id": m, "replica": R2.url}]


def test_a_market_frozen_at_its_owner_is_thawed_and_an_older_copy_not_frozen_is_left_in_place() -> None:
    # Given back by hand (--new set to the old replicas): r1 owns the market and holds it frozen; r2's copy is an import.
    m = market_of(1)
    plan = make_plan([R1, R2], [R1, R2], {R1.url: {m: (9, 4)}, R2.url: {m: (9, 4)}}, {R1.url: {m}})
    assert plan.moves == [] and plan.thaws == [{"market_id": m, "replica": R1.url}] and plan.releases == []
    assert plan.stale == [{"market_id": m, "replica": R2.url, "newest_at": R1.url}]


def test_a_frozen_copy_at_the_owner_is_not_released_when_a_newer_copy_moves_over_it() -> None:
    m = market_of(1)
    plan = make_plan([R1, R2], [R1, R2], {R1.url: {m: (5, 1)}, R2.url: {m: (9, 4)}}, {R1.url: {m}})
    assert plan.moves == [Move(m, R2.url, R1.url)] and plan.releases == [] and plan.thaws == []
