"""Executes the requests adapters build. The only place platform HTTP calls happen.

This is the dispatch hot path (one create per task, plus queries), so it uses aiohttp:
on this project's benchmark machine httpx managed ~220 requests/s against the RunningHub
emulator where aiohttp did ~2,900/s for the same calls (``bench/http_clients.py``).
httpx stays the client everywhere else.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any

import aiohttp
import orjson

from aigcq.domain import Task
from aigcq.jsonlog import ctx
from aigcq.platforms.base import (
    HttpRequest,
    NotFound,
    PlatformAdapter,
    Rejected,
    ResultOutcome,
    SubmitOutcome,
    Succeeded,
    Uncertain,
    Unknown,
)
from aigcq.storage.base import Storage, StorageError

log = logging.getLogger(__name__)

#: Requests in flight at once (also the connection pool size).
MAX_IN_FLIGHT = 64


class PlatformUnavailable(Exception):
    """A query or cancel could not reach the platform; try again later."""


class PlatformClient:
    def __init__(
        self,
        adapters: dict[str, PlatformAdapter],
        *,
        timeout_s: float,
        storage: Storage | None = None,
        file_key: bytes = b"",
    ) -> None:
        self.adapters = adapters
        #: where result files a platform sends inline (base64) are kept and served from
        self.storage = storage
        #: keys the folder names of stored files, so a task id alone cannot find them
        self.file_key = file_key
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """Created lazily: a session must be made inside the running event loop."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_IN_FLIGHT),
                timeout=self.timeout,
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
            )
        return self._session

    def adapter_for(self, platform: str) -> PlatformAdapter | None:
        """The external target that runs tasks of ``platform`` (comfyui -> runninghub)."""
        for adapter in self.adapters.values():
            if platform in adapter.serves:
                return adapter
        return None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _send(self, req: HttpRequest) -> tuple[int, Any]:
        headers, body = req.headers, req.body
        if body is None and req.json is not None:  # once to bytes (aiohttp's json= does twice)
            body = orjson.dumps(req.json)
            if not any(k.lower() == "content-type" for k in headers):
                headers = {**headers, "Content-Type": "application/json"}
        async with self.session.request(req.method, req.url, headers=headers, data=body) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw)
            except orjson.JSONDecodeError:
                return resp.status, {"raw": raw[:500].decode(errors="replace")}

    async def submit(
        self, adapter: PlatformAdapter, task: Task, apikey: str, webhook_url: str
    ) -> SubmitOutcome:
        req = adapter.submit_request(task, apikey, webhook_url)
        try:
            status, body = await self._send(req)
        except aiohttp.ClientConnectorError as exc:
            # The request never reached the platform: safe to send again later.
            log.warning(
                "task %s: %s unreachable: %r",
                task.task_id,
                adapter.name,
                exc,
                extra=ctx(task=task.task_id),
            )
            return Rejected("Unreachable", str(exc) or type(exc).__name__, retryable=True)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "task %s: %s submit outcome unknown: %r",
                task.task_id,
                adapter.name,
                exc,
                extra=ctx(task=task.task_id),
            )
            return Uncertain(str(exc) or type(exc).__name__)
        return adapter.parse_submit(status, body)

    async def query(self, adapter: PlatformAdapter, task: Task, apikey: str) -> ResultOutcome:
        if not task.remote_id:
            return NotFound("no remote task id")
        try:
            status, body = await self._send(adapter.query_request(task, apikey))
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "task %s: %s query failed: %r",
                task.task_id,
                adapter.name,
                exc,
                extra=ctx(task=task.task_id),
            )
            raise PlatformUnavailable(str(exc)) from exc
        outcome = adapter.parse_query(status, body)
        if isinstance(outcome, Succeeded) and outcome.files:
            return await self._store_files(adapter, task, outcome)
        return outcome

    async def _store_files(
        self, adapter: PlatformAdapter, task: Task, outcome: Succeeded
    ) -> Succeeded | Unknown:
        """Store inline result files and hand out their URLs instead. Names are per task
        (a second query of the same result overwrites rather than duplicates) and keyed
        (``platforms/<adapter>/<HMAC(task id)>/<file>``): knowing a task id is not enough
        to fetch its images."""
        if self.storage is None:
            return Unknown("inline result files but no result storage configured")
        data = outcome.data
        listed: Any = data.get("data") if isinstance(data, dict) else data
        if not isinstance(listed, list):
            return Unknown("inline result files but no list to add their URLs to")
        entries = list(listed)
        folder = hmac.new(self.file_key, task.task_id.encode(), hashlib.sha256).hexdigest()[:32]
        try:
            for file in outcome.files:
                name = f"platforms/{adapter.name}/{folder}/{file.name}"
                url = await self.storage.put(name, file.data, file.content_type)
                kind = file.name.rsplit(".", 1)[-1] if "." in file.name else ""
                entries.append({"fileUrl": url, "fileType": kind})
        except StorageError as exc:
            log.warning(
                "task %s: storing %s result files failed: %s",
                task.task_id,
                adapter.name,
                exc,
                extra=ctx(task=task.task_id),
            )
            return Unknown(f"storing result files failed: {exc}")
        return Succeeded({**data, "data": entries} if isinstance(data, dict) else entries)

    async def cancel(self, adapter: PlatformAdapter, task: Task, apikey: str) -> None:
        req = adapter.cancel_request(task, apikey) if task.remote_id else None
        if req is None:
            return
        try:
            await self._send(req)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "task %s: %s cancel failed: %r",
                task.task_id,
                adapter.name,
                exc,
                extra=ctx(task=task.task_id),
            )
