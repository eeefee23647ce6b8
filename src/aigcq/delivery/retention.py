"""Outbox retention by time (seed 001: offline messages are kept 2 days, then dropped).

``XADD MINID`` in ``finish.lua`` trims a client's stream only when that client gets a new
message; a client id that never returns would keep its results forever, and a stream
its client drained stays behind as an empty key. ``finish.lua`` also records each
client's last message time in ``{prefix}:outboxes``, and a periodic sweep (any serve
process; repeating it is harmless) walks that index:

* nothing newer than the retention: the whole stream goes;
* else entries older than the retention are trimmed (``XTRIM MINID``);
* a stream left empty whose last message is older than ``EMPTY_GRACE_S`` goes too. The
  grace keeps a drained stream alive while a new message could get an id at or below the
  last one a connection has seen (ids restart from the clock when a stream is recreated).
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from aigcq.plumbing.text import text
from aigcq.queue.keys import Keys, outbox_minid

log = logging.getLogger(__name__)

EMPTY_GRACE_S = 60.0
RETENTION_SWEEP_S = 60.0  # how often a serve process runs the sweep
PAGE = 500

#: KEYS: the outboxes index. ARGV: an outbox's key less its backendId (``keys.outbox("")``),
#: cutoff (s: older messages go), minid (ms), empty-before (s), start, count
#: returns {members looked at, streams dropped}
_SWEEP = """
local index, outbox = KEYS[1], ARGV[1]
local cutoff, empty_before = tonumber(ARGV[2]), tonumber(ARGV[4])
local start = tonumber(ARGV[5])
local page = redis.call('ZRANGE', index, start, start + tonumber(ARGV[6]) - 1, 'WITHSCORES')
local dropped = 0
for i = 1, #page, 2 do
  local id, last = page[i], tonumber(page[i + 1])
  local key = outbox .. id
  if last < cutoff then
    redis.call('DEL', key)
  elseif redis.call('EXISTS', key) == 1 then
    redis.call('XTRIM', key, 'MINID', ARGV[3])
  end
  local left = redis.call('EXISTS', key) == 1 and redis.call('XLEN', key) or 0
  if left == 0 and last < empty_before then
    redis.call('DEL', key)
    redis.call('ZREM', index, id)
    dropped = dropped + 1
  end
end
return {#page / 2, dropped}
"""


class OutboxRetention:
    def __init__(self, redis: Redis, keys: Keys, retention_s: float) -> None:
        self.redis = redis
        self.keys = keys
        self.retention_s = retention_s
        self._sweep = redis.register_script(_SWEEP)
        self._indexed = False

    async def sweep(self, now: float) -> int:
        """One pass over every client's outbox; the number of streams dropped."""
        if not self._indexed:
            await self.index_existing(now)
            self._indexed = True
        cutoff = now - self.retention_s
        minid = outbox_minid(now, self.retention_s)
        args: list[str | float] = [self.keys.outbox(""), cutoff, minid]
        args.append(now - EMPTY_GRACE_S)
        start = dropped = 0
        while True:
            seen, gone = await self._sweep(keys=[self.keys.outboxes], args=[*args, start, PAGE])
            dropped += int(gone)
            if int(seen) < PAGE:
                break
            start += int(seen) - int(gone)
        if dropped:
            log.info("outbox retention: %d client streams dropped", dropped)
        return dropped

    async def index_existing(self, now: float) -> None:
        """Index streams written before the index existed (once per process): their age
        is unknown, so they count as written ``now`` (kept one more retention period)."""
        prefix = self.keys.outbox("")
        cursor: int = 0
        while True:  # one ZADD per SCAN page, not one round trip per stream
            cursor, raws = await self.redis.scan(cursor, f"{prefix}*", 1000, "stream")
            if raws:
                found = {text(raw)[len(prefix) :]: now for raw in raws}
                await self.redis.zadd(self.keys.outboxes, found, nx=True)
            if not cursor:
                return
