"""The Redis client of a server process.

redis-py's asyncio connections pack every command in pure Python (about 10 calls per
argument); its sync connections already use hiredis' C packer when hiredis is
installed. With several script calls per task that packing was a visible share of a
server's CPU, so our connections use the C packer too.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE


class _HiredisPacking:
    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._packer.pack(*args)  # type: ignore[no-any-return]


def redis_client(url: str) -> aioredis.Redis:
    """A client on a blocking pool of up to 256 connections.

    redis-py 8's default pool fails the 101st concurrent command (MaxConnectionsError,
    e.g. 160 TASK_ENDs at once); a blocking pool waits for a free connection instead.
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url, decode_responses=True, max_connections=256, timeout=20
    )
    if HIREDIS_AVAILABLE:
        base = pool.connection_class
        pool.connection_class = type(f"Hiredis{base.__name__}", (_HiredisPacking, base), {})
    return aioredis.Redis.from_pool(pool)
