"""Free bridge slots of the other processes, known at once (issue 24): a slot freed on
one process is read by the others when it frees, not at their next periodic read, so no
process pays for a task that slot could run meanwhile."""

from __future__ import annotations

import asyncio
import contextlib

import redis.asyncio as aioredis

from aigcq.bridges.peers import PeerCapacity
from aigcq.plumbing.events import EventBus
from aigcq.queue.keys import Keys
from tests.fakes.waiting import until

PERIOD_S = 60.0  # the periodic read: never within the test


async def test_a_slot_freed_on_one_process_is_known_to_the_others_at_once(
    redis: aioredis.Redis,
) -> None:
    keys = Keys("peers-test")
    free = {"a": 0, "b": 0}

    def peer(name: str) -> PeerCapacity:
        return PeerCapacity(
            redis,
            keys.internal_free,
            lambda: (free[name], 1),
            on_less=lambda: None,
            channel=keys.events,
            interval_s=PERIOD_S,
        )

    a, b = peer("a"), peer("b")
    subscribed = asyncio.Event()
    bus = EventBus(
        redis,
        keys.events,
        on_wake=subscribed.set,
        on_outbox=lambda _: None,
        on_client=lambda *_: None,
        on_progress=lambda *_: None,
        on_capacity=a.changed,
    )
    loops = [asyncio.create_task(f()) for f in (bus.run, a.run, b.run)]
    try:
        await asyncio.wait_for(subscribed.wait(), 5)
        await until(lambda: _bridges_elsewhere(a), lambda n: n == 1)
        assert a.elsewhere == 0
        free["b"] = 2
        b.changed()  # b's hub: a slot freed
        await until(lambda: _elsewhere(a), lambda n: n == 2)
        free["b"] = 0
        b.changed()  # taken again: a learns it at its next read (none comes in the test)
        await asyncio.sleep(0.3)
        assert a.elsewhere == 2
    finally:
        for loop in loops:
            loop.cancel()
        for loop in loops:
            with contextlib.suppress(asyncio.CancelledError):
                await loop


async def _elsewhere(peer: PeerCapacity) -> int:
    return peer.elsewhere


async def _bridges_elsewhere(peer: PeerCapacity) -> int:
    return peer.bridges_elsewhere
