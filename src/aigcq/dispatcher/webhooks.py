"""Delivery of finished tasks to their ``webhookUrl`` as RunningHub ``TASK_END`` events.

Tasks taken by the message-dispatcher belong to one backend id, :data:`WEBHOOK_BACKEND`.
Finishing a task appends it to that backend's outbox stream in the same atomic step
(:mod:`aigcq.delivery.outbox`), and the relay drains the stream: an entry is deleted
only once delivered (2xx) or refused for good (4xx) or out of attempts, so a restart
resends, never loses. Receivers deduplicate by task id (aigcq answers 410 to a repeat).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import httpx
from redis.asyncio import Redis

from aigcq.dispatcher.formats import task_end
from aigcq.observability import metrics
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import round_failed, round_ok
from aigcq.queue.store import TaskStore

log = logging.getLogger(__name__)

WEBHOOK_BACKEND = "webhook"
PAGE = 100
MAX_BACKOFF_S = 60.0


@dataclass(slots=True)
class _Retry:
    attempts: int
    due: float


class WebhookRelay:
    def __init__(
        self, redis: Redis, store: TaskStore, *, attempts: int, timeout_s: float = 10.0
    ) -> None:
        self.redis = redis
        self.store = store
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.key = store.keys.outbox(WEBHOOK_BACKEND)
        self._retries: dict[str, _Retry] = {}

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            while True:
                try:
                    last = await self.drain(http)
                    # Wakes on a new entry, or after a second for retries that fell due.
                    await self.redis.xread({self.key: last}, block=1000)
                except Exception as exc:
                    round_failed(log, "webhook relay round failed", exc)
                    await asyncio.sleep(1.0)
                else:
                    round_ok(log, "webhook relay round failed")

    async def drain(self, http: httpx.AsyncClient) -> str:
        """Try every entry that is due once; returns the last entry id seen."""
        now = time.monotonic()
        entries = await self.redis.xrange(self.key, count=PAGE) or []
        due = [(str(i), f or {}) for i, f in entries if now >= self._due(str(i))]
        await asyncio.gather(*(self._deliver(http, i, str(f.get("taskId", ""))) for i, f in due))
        return str(entries[-1][0]) if entries else "0-0"

    def _due(self, entry_id: str) -> float:
        retry = self._retries.get(entry_id)
        return retry.due if retry else 0.0

    async def _deliver(self, http: httpx.AsyncClient, entry_id: str, task_id: str) -> None:
        task = await self.store.reads.get(task_id)
        url = task.payload.get("webhookUrl") if task else None
        if task is None or not isinstance(url, str) or not url:
            await self._done(entry_id)
            return
        try:
            resp = await http.post(
                url, content=task_end(task), headers={"Content-Type": "application/json"}
            )
            failure = f"HTTP {resp.status_code}" if resp.status_code >= 500 else ""
        except httpx.HTTPError as exc:
            failure = repr(exc)
        if not failure:
            log.info(
                "task %s: TASK_END delivered to %s (%s)",
                task_id,
                url,
                resp.status_code,
                extra=ctx(task=task_id),
            )
            await self._done(entry_id)
            return
        retry = self._retries.setdefault(entry_id, _Retry(0, 0.0))
        retry.attempts += 1
        metrics.webhook_failed(dropped=retry.attempts >= self.attempts)
        if retry.attempts >= self.attempts:
            log.error(
                "task %s: TASK_END to %s dropped: %s",
                task_id,
                url,
                failure,
                extra=ctx(task=task_id),
            )
            await self._done(entry_id)
            return
        retry.due = time.monotonic() + min(2.0 ** (retry.attempts - 1), MAX_BACKOFF_S)
        log.warning(
            "task %s: TASK_END to %s failed (%s), will retry",
            task_id,
            url,
            failure,
            extra=ctx(task=task_id),
        )

    async def _done(self, entry_id: str) -> None:
        await self.redis.xdel(self.key, entry_id)
        self._retries.pop(entry_id, None)
