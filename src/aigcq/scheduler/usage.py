"""Recent GPU-seconds per AIGC project and per end user, kept in Redis (issue 27).

Every serve process plans its rounds from the same numbers: a grant of our GPUs charges
its task's project and user the expected run time (the recent mean of its workflow) in one
atomic step, decayed with ``AIGCQ_SHARE_HALF_LIFE_S`` as :func:`aigcq.scheduler.policy.decayed`
does: each record is ``"<GPU-seconds> <when>"``, and a charge first decays it to now. A
record nobody charged for twenty half-lives (it is below a millionth of what it was) expires.
The workflows' recent mean run times are recorded by the finishing script as a run on our
GPUs succeeds (``{P}:runs``, :func:`aigcq.scheduler.policy.next_mean`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from redis.asyncio import Redis

from aigcq.plumbing.redis_mux import RedisMux
from aigcq.queue.keys import Keys

#: KEYS: usage records; ARGV: now, half-life (s), TTL (s), then what each key is charged
_CHARGE = """
local now, half, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
for i, key in ipairs(KEYS) do
  local value, at = 0, now
  local before = redis.call('GET', key)
  if before then
    local v, t = string.match(before, '^(%S+) (%S+)$')
    value, at = tonumber(v) or 0, tonumber(t) or now
  end
  value = value * math.pow(0.5, math.max(now - at, 0) / half) + tonumber(ARGV[3 + i])
  redis.call('SET', key, string.format('%.17g %.17g', value, now), 'EX', ttl)
end
return #KEYS
"""

#: half-lives a record is kept after its last charge
KEEP_HALF_LIVES = 20


class Usage:
    def __init__(self, redis: Redis, mux: RedisMux, keys: Keys, half_life_s: float) -> None:
        """``mux``: the hot-path connection (a charge shares the write of the claims)."""
        self.keys = keys
        self.half_life_s = half_life_s
        self.mux = mux
        self._charge = redis.register_script(_CHARGE)

    async def charge(
        self,
        projects: Mapping[str, float],
        users: Mapping[tuple[str, str], float],
        now: float | None = None,
    ) -> None:
        """Add GPU-seconds to projects' and their users' (project, userId) records."""
        charges = {self.keys.usage(p): s for p, s in projects.items() if s > 0}
        charges |= {self.keys.usage(p, u): s for (p, u), s in users.items() if u and s > 0}
        if not charges:
            return
        now = time.time() if now is None else now
        ttl = max(int(self.half_life_s * KEEP_HALF_LIVES), 1)
        args = [repr(now), repr(self.half_life_s), ttl, *(repr(v) for v in charges.values())]
        await self.mux.script(self._charge, list(charges), args)
