"""The admission check before a task is queued (seed 001's BalanceError).

* ``none``    every task is admitted (default);
* ``quota``   a counter per principal in Redis (``{prefix}:quota:{principal}``: whom the
              client token speaks for, its ``sub``, whichever ids it uses), taken
              atomically; a principal without a counter starts at AIGCQ_ADMISSION_QUOTA;
* ``billing`` ``POST {billing_url}`` with the task; a 2xx ``{"allowed": true}`` admits it.

A refusal answers BalanceError and creates nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import redis.exceptions
from redis.asyncio import Redis

from aigcq.config import Settings
from aigcq.observability.jsonlog import ctx
from aigcq.queue.keys import Keys

log = logging.getLogger(__name__)

_TAKE = """
local v = redis.call('GET', KEYS[1])
if not v then v = ARGV[1]; redis.call('SET', KEYS[1], v) end
if tonumber(v) <= 0 then return -1 end
return redis.call('DECR', KEYS[1])
"""


#: give a quota unit back unless the task exists: a submit whose reply was lost may have
#: created it (then its unit is spent)
_REFUND_IF_ABSENT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('INCR', KEYS[1])
return 1
"""


class Admission:
    def __init__(self, settings: Settings, redis: Redis, keys: Keys) -> None:
        self.mode = settings.admission
        self.settings = settings
        self.redis = redis
        self.keys = keys
        self._take = redis.register_script(_TAKE)
        self._refund_if_absent = redis.register_script(_REFUND_IF_ABSENT)
        self._http = httpx.AsyncClient(timeout=5.0) if self.mode == "billing" else None

    async def admit(self, principal: str, task: dict[str, Any]) -> bool:
        """Whether ``principal`` (whom the token speaks for) may queue ``task``."""
        if self.mode == "quota":
            left = await self._take(
                keys=[self.keys.quota(principal)], args=[self.settings.admission_quota]
            )
            return int(left) >= 0
        if self.mode == "billing" and self._http is not None:
            return await self._ask_billing(principal, task)
        return True

    async def refund(self, principal: str) -> None:
        """Give back a quota unit taken for a submission that created nothing."""
        if self.mode == "quota":
            await self.redis.incr(self.keys.quota(principal))

    async def refund_unless_stored(self, principal: str, task_id: str) -> bool:
        """After a submit whose outcome is unknown (its reply was lost): give the unit
        back only if the task does not exist. True: refunded. A failure to ask keeps the
        unit (a lost unit is the client's retry away; a refund for a task that runs is
        free work)."""
        if self.mode != "quota":
            return False
        try:
            keys = [self.keys.quota(principal), self.keys.task(task_id)]
            return bool(await self._refund_if_absent(keys=keys))
        except redis.exceptions.RedisError as exc:
            log.warning(
                "task %s: quota not refunded, Redis unavailable: %r",
                task_id,
                exc,
                extra=ctx(task=task_id),
            )
            return False

    async def _ask_billing(self, principal: str, task: dict[str, Any]) -> bool:
        assert self._http is not None
        try:
            resp = await self._http.post(
                self.settings.billing_url, json={"backendId": principal, **task}
            )
            return resp.is_success and bool(resp.json().get("allowed"))
        except (httpx.HTTPError, ValueError) as exc:
            log.warning(
                "billing check for task %s failed: %r",
                task.get("taskId"),
                exc,
                extra=ctx(task=task.get("taskId")),
            )
            return False

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
