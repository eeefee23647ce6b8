"""What the other processes' bridges can run, through Redis (:mod:`aigcq.bridges.peer_offers`)."""

from __future__ import annotations

import redis.asyncio as aioredis

from aigcq.bridges.lookahead import Reach
from aigcq.bridges.peer_offers import NOTHING, Offered, PeerOffers
from aigcq.queue.keys import Keys
from aigcq.wire.capabilities import Needs

BASIC = Needs(frozenset({"EmptyImage", "SaveImage"}))
INVERT = Needs(frozenset({"EmptyImage", "ImageInvert", "SaveImage"}))
ODD = Needs(frozenset({"NoSuchNode"}))


def _peer(
    redis: aioredis.Redis, name: str, offered: dict[str, Offered], holding: dict[str, int]
) -> PeerOffers:
    key = Keys("offers-test").internal_offers
    others = lambda: {p: n for p, n in holding.items() if p != name}  # noqa: E731
    return PeerOffers(redis, key, name, lambda: offered[name], others)


async def test_a_process_learns_what_the_others_bridges_run(redis: aioredis.Redis) -> None:
    offered = {"a": Offered((BASIC,), bridges=1), "b": Offered((INVERT,), (BASIC,), 1)}
    holding = {"a": 1, "b": 1}
    a, b = _peer(redis, "a", offered, holding), _peer(redis, "b", offered, holding)
    assert a.reach(BASIC) is Reach.ELSEWHERE  # b holds bridges, its offers not read yet
    await b.sync()
    await a.sync()
    assert a.reach(INVERT) is Reach.ELSEWHERE
    assert a.reach(ODD) is Reach.NOWHERE
    offered["b"] = Offered((), offline=(INVERT,), bridges=1)  # its instance went offline
    await b.sync()
    await a.sync()
    assert a.reach(INVERT) is Reach.OFFLINE
    offered["b"] = Offered(None, bridges=1)  # a seed bridge: it may run anything
    await b.sync()
    await a.sync()
    assert a.reach(ODD) is Reach.ELSEWHERE


async def test_offers_read_before_a_bridge_came_rule_nothing_out(redis: aioredis.Redis) -> None:
    """b's entry was written for one bridge; b holds two now (its capacity entry, read
    every 0.1 s, says so before its offers are read again): what the new one runs is not
    known, so a task none of the first can run is not failed."""
    offered = {"a": NOTHING, "b": Offered((BASIC,), bridges=1)}
    holding = {"b": 1}
    a, b = _peer(redis, "a", offered, holding), _peer(redis, "b", offered, holding)
    await b.sync()
    await a.sync()
    assert a.reach(ODD) is Reach.NOWHERE
    holding["b"] = 2
    assert a.reach(ODD) is Reach.ELSEWHERE


async def test_no_other_process_holding_bridges_means_nowhere(redis: aioredis.Redis) -> None:
    a = _peer(redis, "a", {"a": NOTHING}, {})
    await a.sync()
    assert a.reach(BASIC) is Reach.NOWHERE
