"""What the other processes' bridges can run, through Redis (:mod:`aigcq.bridges.peer_offers`)."""

from __future__ import annotations

import redis.asyncio as aioredis

from aigcq.bridges.capabilities import Needs
from aigcq.bridges.lookahead import Reach
from aigcq.bridges.peer_offers import NOTHING, Offered, PeerOffers
from aigcq.queue.keys import Keys

BASIC = Needs(frozenset({"EmptyImage", "SaveImage"}))
INVERT = Needs(frozenset({"EmptyImage", "ImageInvert", "SaveImage"}))


def _peer(redis: aioredis.Redis, name: str, offered: dict[str, Offered]) -> PeerOffers:
    holding = frozenset(p for p in offered if p != name)
    key = Keys("offers-test").internal_offers
    return PeerOffers(redis, key, name, lambda: offered[name], lambda: holding)


async def test_a_process_learns_what_the_others_bridges_run(redis: aioredis.Redis) -> None:
    offered = {"a": Offered((BASIC,)), "b": Offered((INVERT,), offline=(BASIC,))}
    a, b = _peer(redis, "a", offered), _peer(redis, "b", offered)
    assert a.reach(BASIC) is Reach.ELSEWHERE  # b holds bridges, its offers not read yet
    await b.sync()
    await a.sync()
    assert a.reach(INVERT) is Reach.ELSEWHERE
    assert a.reach(Needs(frozenset({"NoSuchNode"}))) is Reach.NOWHERE
    offered["b"] = Offered((), offline=(INVERT,))  # its instance went offline
    await b.sync()
    await a.sync()
    assert a.reach(INVERT) is Reach.OFFLINE
    offered["b"] = Offered(None)  # a seed bridge: it may run anything
    await b.sync()
    await a.sync()
    assert a.reach(Needs(frozenset({"NoSuchNode"}))) is Reach.ELSEWHERE


async def test_no_other_process_holding_bridges_means_nowhere(redis: aioredis.Redis) -> None:
    offered = {"a": NOTHING}
    a = _peer(redis, "a", offered)
    await a.sync()
    assert a.reach(BASIC) is Reach.NOWHERE
