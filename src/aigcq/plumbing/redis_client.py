"""The Redis client of a server process.

redis-py's asyncio connections pack every command in pure Python (about 10 calls per
argument); its sync connections already use hiredis' C packer when hiredis is
installed. With several script calls per task that packing was a visible share of a
server's CPU, so our connections use the C packer too.

Every client of every process is made here, from one URL (:mod:`aigcq.plumbing.redis_address`):
one server, or a master found through Sentinel. A Sentinel client's connections ask the
sentinels for the master each time they connect, and drop themselves when the server they
are on answers READONLY (it was demoted), so after a failover every connection (the pool's,
pub/sub's, the hot path's :class:`~aigcq.plumbing.redis_mux.RedisMux`) finds the new master
with no restart.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

from aigcq.plumbing.redis_address import is_sentinel, parse_sentinel_url

#: the pool's size and how long a command waits for a free connection
MAX_CONNECTIONS, CHECKOUT_TIMEOUT_S = 256, 20
#: a sentinel that does not answer within a second is skipped for the next one (the URL's
#: socket_timeout / socket_connect_timeout, when given, apply instead)
SENTINEL_DEFAULTS = {"decode_responses": True, "socket_timeout": 1.0, "socket_connect_timeout": 1.0}


class _HiredisPacking:
    # untyped in redis-py 8.2, typed in 8.1: either passes mypy
    _packer = HiredisRespSerializer()  # type: ignore[no-untyped-call, unused-ignore]

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._packer.pack(*args)  # type: ignore[no-any-return]


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """redis-py's Sentinel pool, blocking like :func:`redis_client`'s other pool; closing
    it closes its clients of the sentinels too."""

    async def aclose(self) -> None:
        await super().aclose()
        await self.sentinel_manager.aclose()


def redis_client(url: str) -> aioredis.Redis:
    """A client on a blocking pool of up to 256 connections (to the master, for a
    ``redis+sentinel://`` URL). :class:`~aigcq.plumbing.redis_address.RedisAddressError`
    when ``url`` names no Redis.

    redis-py 8's default pool fails the 101st concurrent command (MaxConnectionsError,
    e.g. 160 TASK_ENDs at once); a blocking pool waits for a free connection instead.
    """
    pool: aioredis.BlockingConnectionPool
    if is_sentinel(url):
        pool = _sentinel_pool(url)
    else:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, decode_responses=True, max_connections=MAX_CONNECTIONS, timeout=CHECKOUT_TIMEOUT_S
        )
    if HIREDIS_AVAILABLE:
        base = pool.connection_class
        pool.connection_class = type(f"Hiredis{base.__name__}", (_HiredisPacking, base), {})
    return aioredis.Redis.from_pool(pool)


def _sentinel_pool(url: str) -> BlockingSentinelPool:
    address = parse_sentinel_url(url)
    sentinel_options = {**SENTINEL_DEFAULTS, **address.sentinel_options}
    sentinels = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        list(address.sentinels), sentinel_kwargs=sentinel_options
    )
    return BlockingSentinelPool(  # type: ignore[no-untyped-call]
        address.master,
        sentinels,
        decode_responses=True,
        max_connections=MAX_CONNECTIONS,
        timeout=CHECKOUT_TIMEOUT_S,
        **address.options,
    )
