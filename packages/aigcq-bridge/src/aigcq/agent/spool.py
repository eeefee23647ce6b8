"""TASK_END delivery that survives restarts.

A finished result is written to ``<data dir>/spool/<taskId>.json`` *before* the first POST,
and removed only once the hub answered: 2xx (taken), 404 or 410 (no longer wanted), or
another 4xx but 408 and 429 (refused for good: a body or a signature the hub will never
take; sending it again would loop forever). 5xx, 408, 429 and no answer are tried again
with back-off, but a 503 every :data:`STORE_OUTAGE_RETRY_S` at most: the hub answered, only
its Redis is out for a moment, and the slot the TASK_END frees stays taken until it lands
(a GPU idles, and another process may pay for what it could run). On start-up every
spooled result is sent again; when the bridge (re)connects to the hub every undelivered one
is tried again at once (:meth:`WebhookSender.wake`). A newer attempt of the task may take
an undelivered result over (:meth:`WebhookSender.readdress`: its own webhook URL from then
on).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import httpx

from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import backoff_delay
from aigcq.plumbing.cancel import cancel_and_wait
from aigcq.wire.bridge import TaskEndBody

log = logging.getLogger(__name__)

DROP_STATUSES = frozenset({404, 410})
#: 4xx answers that may change if asked again later
RETRY_STATUSES = frozenset({408, 429})
#: the hub is up, its store is not (Redis restarting, a failover): try again this soon
STORE_OUTAGE = 503
STORE_OUTAGE_RETRY_S = 0.5
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SpooledResult:
    webhook_url: str
    body: TaskEndBody

    @property
    def task_id(self) -> str:
        return self.body.task_id


class JsonFiles:
    """One JSON file per task id in ``directory``, written atomically (fsync, rename).

    :meth:`save` and :meth:`discard` do their disk work in a thread, off the event loop (an
    fsync takes milliseconds, a loaded disk's much more), and return once it is done: what
    is saved is on disk before the caller goes on. A task id's saves and discards land in
    the order they were asked."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._order: dict[str, _Turns] = {}

    def _path(self, task_id: str) -> Path:
        return self.directory / f"{quote(task_id, safe='')}.json"

    def _write(self, task_id: str, data: dict[str, Any]) -> None:
        tmp = self._path(task_id).with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self._path(task_id))

    def _remove(self, task_id: str) -> None:
        self._path(task_id).unlink(missing_ok=True)

    async def save(self, task_id: str, data: dict[str, Any]) -> None:
        await self._in_turn(task_id, self._write, task_id, data)

    async def discard(self, task_id: str) -> None:
        await self._in_turn(task_id, self._remove, task_id)

    async def _in_turn(self, task_id: str, work: Callable[..., None], *args: Any) -> None:
        """``work(*args)`` in a thread, after the earlier disk work of ``task_id``."""
        turns = self._order.setdefault(task_id, _Turns())
        turns.waiting += 1
        try:
            async with turns.lock:
                await asyncio.to_thread(work, *args)
        finally:
            turns.waiting -= 1
            if not turns.waiting:
                del self._order[task_id]

    def __contains__(self, task_id: str) -> bool:
        return self._path(task_id).exists()

    def task_ids(self) -> list[str]:
        return sorted(unquote(p.stem) for p in self.directory.glob("*.json"))

    def read_all(self, parse: Callable[[dict[str, Any]], T]) -> list[T]:
        """Every file through ``parse``; an unreadable one is logged and left in place."""
        items = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                items.append(parse(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError) as e:
                log.error("%s: unreadable %s left in place: %s", self.directory.name, path, e)
        return items


@dataclass(eq=False)
class _Turns:
    """One task id's disk work: one at a time, in order; ``waiting``: how many are asked."""

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    waiting: int = 0


class Spool(JsonFiles):
    """Undelivered results."""

    async def put(self, item: SpooledResult) -> None:
        body = item.body.model_dump()
        await self.save(item.task_id, {"webhookUrl": item.webhook_url, "body": body})

    def load_all(self) -> list[SpooledResult]:
        return self.read_all(
            lambda data: SpooledResult(data["webhookUrl"], TaskEndBody.model_validate(data["body"]))
        )


class WebhookSender:
    """POSTs spooled results until the hub takes them, with capped exponential backoff."""

    def __init__(self, http: httpx.AsyncClient, spool: Spool, max_delay: float = 60.0) -> None:
        self.http = http
        self.spool = spool
        self.max_delay = max_delay
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._items: dict[str, SpooledResult] = {}  # what each delivery sends next
        self._woken = asyncio.Event()

    async def send(self, item: SpooledResult) -> None:
        """Spool ``item`` (if not yet: on disk when this returns) and deliver it in the
        background."""
        if item.task_id not in self.spool:
            await self.spool.put(item)
        if item.task_id not in self._tasks:
            self._items[item.task_id] = item
            task = asyncio.create_task(self._deliver(item.task_id), name=f"task-end-{item.task_id}")
            self._tasks[item.task_id] = task
            task.add_done_callback(lambda done: self._forget(item.task_id, done))

    def _forget(self, task_id: str, delivery: asyncio.Task[None]) -> None:
        if self._tasks.get(task_id) is delivery:  # not a newer delivery of the same task
            del self._tasks[task_id]
            del self._items[task_id]

    def undelivered(self, task_id: str) -> SpooledResult | None:
        return self._items.get(task_id)

    async def readdress(self, task_id: str, webhook_url: str) -> None:
        """Send ``task_id``'s undelivered result to ``webhook_url`` from now on (a newer
        attempt of the task took it over), and try at once."""
        item = dataclasses.replace(self._items[task_id], webhook_url=webhook_url)
        await self.spool.put(item)
        self._items[task_id] = item
        self.wake()

    async def drop(self, task_id: str) -> None:
        """Stop delivering ``task_id``'s result and forget it."""
        task = self._tasks.get(task_id)
        if task is not None:
            await cancel_and_wait([task])
            self._forget(task_id, task)
        await self.spool.discard(task_id)

    def wake(self) -> None:
        """Try every undelivered result now (the hub is reachable again), not at the end of
        its back-off."""
        self._woken.set()
        self._woken = asyncio.Event()

    async def resend_spooled(self) -> int:
        items = self.spool.load_all()
        for item in items:
            await self.send(item)
        return len(items)

    async def close(self) -> None:
        await cancel_and_wait(list(self._tasks.values()))

    async def _deliver(self, task_id: str) -> None:
        attempt = 0
        while True:
            attempt += 1
            # a wake from here on (a readdress, the hub back) cuts this try's back-off short,
            # even one that comes while the try is out
            woken = self._woken
            item = self._items[task_id]
            status, outcome = await self._post(item, item.body.model_dump(mode="json"))
            if status is not None and _refused_for_good(status):
                log.error(
                    "task %s: TASK_END refused by the hub (%s), dropped",
                    item.task_id,
                    outcome,
                    extra=ctx(task=item.task_id),
                )
                await self.spool.discard(item.task_id)
                return
            if status is not None and (200 <= status < 300 or status in DROP_STATUSES):
                log.info(
                    "task %s: TASK_END delivered (HTTP %s, try %d)",
                    item.task_id,
                    status,
                    attempt,
                    extra=ctx(task=item.task_id),
                )
                await self.spool.discard(item.task_id)
                return
            delay = retry_delay(attempt, status, self.max_delay)
            log.warning(
                "task %s: TASK_END try %d failed (%s); retry in %.1fs",
                item.task_id,
                attempt,
                outcome,
                delay,
                extra=ctx(task=item.task_id),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), delay)

    async def _post(
        self, item: SpooledResult, payload: dict[str, object]
    ) -> tuple[int | None, str]:
        """The HTTP status (None when no answer came) and what happened, for the log."""
        try:
            resp = await self.http.post(item.webhook_url, json=payload, timeout=15.0)
        except httpx.HTTPError as e:
            return None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return resp.status_code, f"HTTP {resp.status_code}"


def retry_delay(attempt: int, status: int | None, cap: float) -> float:
    """Seconds before try ``attempt`` + 1 after try ``attempt`` (1-based) got ``status``
    (None: no answer): 1, 2, 4 … jittered up to ``cap``; after a 503 at most
    :data:`STORE_OUTAGE_RETRY_S`."""
    delay = backoff_delay(attempt - 1, cap)
    return min(delay, STORE_OUTAGE_RETRY_S) if status == STORE_OUTAGE else delay


def _refused_for_good(status: int) -> bool:
    """A 4xx that sending the same TASK_END again cannot change."""
    return 400 <= status < 500 and status not in DROP_STATUSES | RETRY_STATUSES
