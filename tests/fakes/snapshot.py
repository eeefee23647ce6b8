"""A whole-Redis snapshot: what "a refused request changes nothing" is checked against."""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import Any

import redis.asyncio as aioredis

#: keys background loops rewrite on their own schedule (health state, free bridge slots
#: and what the bridges offer per process, the loops' leases, which expire, the connected
#: clients' presence): not part of what a refused request must leave unchanged
BACKGROUND_KEYS = re.compile(r"^md:state:|:internal:(free|offers)$|:lock:|:online:")


async def redis_snapshot(redis: aioredis.Redis) -> dict[str, tuple[str, Any]]:
    """Every key with its type and whole content: what 'changes nothing' is checked
    against (sizes alone would miss a field rewritten in place, a task's status say)."""
    read = {
        "hash": redis.hgetall,
        "list": lambda k: redis.lrange(k, 0, -1),
        "zset": lambda k: redis.zrange(k, 0, -1, withscores=True),
        "set": lambda k: _sorted(redis.smembers(k)),
        "string": redis.get,
        "stream": lambda k: redis.xrange(k),
    }
    out: dict[str, tuple[str, Any]] = {}
    for key in await redis.keys("*"):
        if BACKGROUND_KEYS.search(str(key)):
            continue
        kind = str(await redis.type(key))
        content = read.get(kind)
        out[str(key)] = (kind, await content(key) if content else None)
    return out


async def _sorted(members: Awaitable[set[Any]]) -> list[Any]:
    return sorted(await members)
