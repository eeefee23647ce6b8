"""Which clients are connected now, anywhere in the fleet.

A connected client's key (``keys.online``) holds its connection's id, with a TTL of
:data:`PRESENT_TTL_S` that the process holding the socket renews every :data:`RENEW_S`
(one pipelined round trip for all its clients). A connection that closes deletes its key
if the key is still its own (a newer connection, here or elsewhere, keeps it); a process
that dies leaves its clients' keys to expire. So a client counts as offline at most
:data:`PRESENT_TTL_S` after it went away with its process, and never while connected.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis

from aigcq.queue.keys import Keys

PRESENT_TTL_S = 30
RENEW_S = 10.0

#: forget a client only if its key is still this connection's (not a newer one's)
_LEFT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""


class Presence:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._left = redis.register_script(_LEFT)

    async def online(self, backend_id: str) -> bool:
        return bool(await self.redis.exists(self.keys.online(backend_id)))

    async def renew(self, connections: Iterable[tuple[str, str]]) -> None:
        """Mark each (backendId, connId) connected for another :data:`PRESENT_TTL_S`."""
        pipe = self.redis.pipeline(transaction=False)
        for backend_id, conn_id in connections:
            pipe.set(self.keys.online(backend_id), conn_id, ex=PRESENT_TTL_S)
        if pipe.command_stack:
            await pipe.execute()

    async def left(self, backend_id: str, conn_id: str) -> None:
        await self._left(keys=[self.keys.online(backend_id)], args=[conn_id])
