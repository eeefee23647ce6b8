"""Executes the requests adapters build. The only place platform HTTP calls happen."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from aigcq.domain import Task
from aigcq.platforms.base import (
    HttpRequest,
    NotFound,
    PlatformAdapter,
    Rejected,
    ResultOutcome,
    SubmitOutcome,
    Uncertain,
)

log = logging.getLogger(__name__)


#: Requests in flight at once. httpcore's pool does O(waiting x connections) work per
#: request, so hundreds of queued requests cost more CPU than the requests themselves;
#: waiting on a semaphore instead keeps each call O(1).
MAX_IN_FLIGHT = 64


class PlatformClient:
    def __init__(self, adapters: dict[str, PlatformAdapter], *, timeout_s: float) -> None:
        self.adapters = adapters
        self.http = httpx.AsyncClient(
            timeout=timeout_s,
            limits=httpx.Limits(
                max_connections=MAX_IN_FLIGHT, max_keepalive_connections=MAX_IN_FLIGHT
            ),
        )
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)

    def adapter_for(self, platform: str) -> PlatformAdapter | None:
        """The external target that runs tasks of ``platform`` (comfyui -> runninghub)."""
        for adapter in self.adapters.values():
            if platform in adapter.serves:
                return adapter
        return None

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _send(self, req: HttpRequest) -> tuple[int, Any]:
        async with self._slots:
            resp = await self.http.request(req.method, req.url, headers=req.headers, json=req.json)
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, {"raw": resp.text[:500]}

    async def submit(
        self, adapter: PlatformAdapter, task: Task, apikey: str, webhook_url: str
    ) -> SubmitOutcome:
        req = adapter.submit_request(task, apikey, webhook_url)
        try:
            status, body = await self._send(req)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # The request never reached the platform: safe to send again later.
            log.warning("task %s: %s unreachable: %r", task.task_id, adapter.name, exc)
            return Rejected("Unreachable", str(exc) or type(exc).__name__, retryable=True)
        except httpx.HTTPError as exc:
            log.warning("task %s: %s submit outcome unknown: %r", task.task_id, adapter.name, exc)
            return Uncertain(str(exc) or type(exc).__name__)
        return adapter.parse_submit(status, body)

    async def query(self, adapter: PlatformAdapter, task: Task, apikey: str) -> ResultOutcome:
        if not task.remote_id:
            return NotFound("no remote task id")
        req = adapter.query_request(task, apikey)
        try:
            status, body = await self._send(req)
        except httpx.HTTPError as exc:
            log.warning("task %s: %s query failed: %r", task.task_id, adapter.name, exc)
            raise
        return adapter.parse_query(status, body)

    async def cancel(self, adapter: PlatformAdapter, task: Task, apikey: str) -> None:
        req = adapter.cancel_request(task, apikey) if task.remote_id else None
        if req is None:
            return
        try:
            await self._send(req)
        except httpx.HTTPError as exc:
            log.warning("task %s: %s cancel failed: %r", task.task_id, adapter.name, exc)
