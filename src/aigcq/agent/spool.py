"""TASK_END delivery that survives restarts.

A finished result is written to ``<data dir>/spool/<taskId>.json`` *before* the first POST,
and removed only once the hub answered: 2xx (taken), 404 or 410 (no longer wanted), or
another 4xx but 408 and 429 (refused for good: a body or a signature the hub will never
take; sending it again would loop forever). 5xx, 408, 429 and no answer are tried again
with back-off. On start-up every spooled result is sent again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import httpx

from aigcq.bridges.protocol import TaskEndBody
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import cancel_and_wait

log = logging.getLogger(__name__)

DROP_STATUSES = frozenset({404, 410})
#: 4xx answers that may change if asked again later
RETRY_STATUSES = frozenset({408, 429})
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SpooledResult:
    webhook_url: str
    body: TaskEndBody

    @property
    def task_id(self) -> str:
        return self.body.task_id


class JsonFiles:
    """One JSON file per task id in ``directory``, written atomically (fsync, rename)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, task_id: str) -> Path:
        return self.directory / f"{quote(task_id, safe='')}.json"

    def write(self, task_id: str, data: dict[str, Any]) -> None:
        tmp = self._path(task_id).with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self._path(task_id))

    def remove(self, task_id: str) -> None:
        self._path(task_id).unlink(missing_ok=True)

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


class Spool(JsonFiles):
    """Undelivered results."""

    def put(self, item: SpooledResult) -> None:
        self.write(item.task_id, {"webhookUrl": item.webhook_url, "body": item.body.model_dump()})

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

    def send(self, item: SpooledResult) -> None:
        """Spool ``item`` (if not yet) and deliver it in the background."""
        if item.task_id not in self.spool:
            self.spool.put(item)
        if item.task_id not in self._tasks:
            task = asyncio.create_task(self._deliver(item), name=f"task-end-{item.task_id}")
            self._tasks[item.task_id] = task
            task.add_done_callback(lambda _: self._tasks.pop(item.task_id, None))

    def resend_spooled(self) -> int:
        items = self.spool.load_all()
        for item in items:
            self.send(item)
        return len(items)

    async def close(self) -> None:
        await cancel_and_wait(list(self._tasks.values()))

    async def _deliver(self, item: SpooledResult) -> None:
        payload = item.body.model_dump(mode="json")
        attempt = 0
        while True:
            attempt += 1
            status, outcome = await self._post(item, payload)
            if status is not None and _refused_for_good(status):
                log.error(
                    "task %s: TASK_END refused by the hub (%s), dropped",
                    item.task_id,
                    outcome,
                    extra=ctx(task=item.task_id),
                )
                self.spool.remove(item.task_id)
                return
            if status is not None and (200 <= status < 300 or status in DROP_STATUSES):
                log.info(
                    "task %s: TASK_END delivered (HTTP %s, try %d)",
                    item.task_id,
                    status,
                    attempt,
                    extra=ctx(task=item.task_id),
                )
                self.spool.remove(item.task_id)
                return
            delay = min(self.max_delay, 0.5 * 2 ** min(attempt, 16)) * random.uniform(0.5, 1.0)
            log.warning(
                "task %s: TASK_END try %d failed (%s); retry in %.1fs",
                item.task_id,
                attempt,
                outcome,
                delay,
                extra=ctx(task=item.task_id),
            )
            await asyncio.sleep(delay)

    async def _post(
        self, item: SpooledResult, payload: dict[str, object]
    ) -> tuple[int | None, str]:
        """The HTTP status (None when no answer came) and what happened, for the log."""
        try:
            resp = await self.http.post(item.webhook_url, json=payload, timeout=15.0)
        except httpx.HTTPError as e:
            return None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return resp.status_code, f"HTTP {resp.status_code}"


def _refused_for_good(status: int) -> bool:
    """A 4xx that sending the same TASK_END again cannot change."""
    return 400 <= status < 500 and status not in DROP_STATUSES | RETRY_STATUSES
