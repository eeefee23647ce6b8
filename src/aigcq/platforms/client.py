"""Executes the requests adapters build. The only place platform HTTP calls happen.

This is the dispatch hot path (one create per task, plus queries), so it uses aiohttp:
on this project's benchmark machine httpx managed ~220 requests/s against the RunningHub
emulator where aiohttp did ~2,900/s for the same calls (``bench/http_clients.py``).
httpx stays the client everywhere else.

A request first waits for one of ``max_in_flight`` places (not counted in its timeout: a
request still waiting has not left); only then is a create recorded as possibly out
(``begin``) and sent. What provably never reached the platform (connect or DNS errors, a
connect timeout) is :class:`NotSent`; a lost or late reply is :class:`Uncertain`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson

from aigcq.domain import Task
from aigcq.observability.jsonlog import ctx
from aigcq.platforms.base import (
    AccountState,
    HttpRequest,
    NotFound,
    NotSent,
    PlatformAdapter,
    ResultOutcome,
    SubmitOutcome,
    Succeeded,
    Uncertain,
    Unknown,
)
from aigcq.storage.base import Storage, StorageError

log = logging.getLogger(__name__)

#: Requests in flight at once (also the connection pool size), by default.
MAX_IN_FLIGHT = 64

#: errors raised before a byte of the request was sent
NOT_SENT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)

#: called just before a create is sent; False: do not send it
BeforeSend = Callable[[], Awaitable[bool]]


class PlatformClient:
    def __init__(
        self,
        adapters: dict[str, PlatformAdapter],
        *,
        timeout_s: float,
        max_in_flight: int = MAX_IN_FLIGHT,
        storage: Storage | None = None,
        file_key: bytes = b"",
    ) -> None:
        self.adapters = adapters
        #: where result files a platform sends inline (base64) are kept and served from
        self.storage = storage
        #: keys the folder names of stored files, so a task id alone cannot find them
        self.file_key = file_key
        # connect: establishing a connection (a free pooled one is waited for before,
        # outside this timeout); sock_read: the reply, once the request is out.
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=timeout_s, sock_read=timeout_s
        )
        self.max_in_flight = max_in_flight
        self._slots = asyncio.Semaphore(max_in_flight)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """Created lazily: a session must be made inside the running event loop."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_in_flight),
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
        self,
        adapter: PlatformAdapter,
        task: Task,
        apikey: str,
        webhook_url: str,
        begin: BeforeSend | None = None,
        traceparent: str = "",
    ) -> SubmitOutcome:
        """Send a create. ``begin`` runs once a place is free, just before the request
        leaves (it records the create as possibly out); False sends nothing.
        ``traceparent``: sent as that header (the task's trace goes on there)."""
        req = adapter.submit_request(task, apikey, webhook_url)
        if traceparent:
            req = dataclasses.replace(req, headers={**req.headers, "traceparent": traceparent})
        async with self._slots:
            if begin is not None and not await begin():
                return NotSent("not sent: the task moved on, or its intent is not replicated")
            try:
                status, body = await self._send(req)
            except NOT_SENT_ERRORS as exc:
                self._warn(task, adapter, "create not sent", exc)
                return NotSent(str(exc) or type(exc).__name__)
            except (aiohttp.ClientError, TimeoutError) as exc:
                self._warn(task, adapter, "create outcome unknown", exc)
                return Uncertain(str(exc) or type(exc).__name__)
        return adapter.parse_submit(status, body)

    async def lookup(self, adapter: PlatformAdapter, task: Task, apikey: str) -> str | None:
        """The remote task a create of ``task``'s attempt made, found by its labels where
        the platform can search (None: not found, not searchable, no answer)."""
        answer = await self._ask(adapter, task, adapter.lookup_request(task, apikey), "look-up")
        return None if answer is None else adapter.parse_lookup(*answer)

    async def query(self, adapter: PlatformAdapter, task: Task, apikey: str) -> ResultOutcome:
        """The remote task's state, a success ready to deliver (inline result files stored,
        their URLs in its data); :class:`Unknown` when the platform gave no answer."""
        outcome = await self.peek(adapter, task, apikey)
        if isinstance(outcome, Succeeded) and outcome.files:
            return await self._store_files(adapter, task, outcome)
        return outcome

    async def peek(self, adapter: PlatformAdapter, task: Task, apikey: str) -> ResultOutcome:
        """The remote task's state as the platform says it, inline files left unstored: for
        a caller that only needs to know whether the task ended (an orphan's check)."""
        if not task.remote_id:
            return NotFound("no remote task id")
        try:
            async with self._slots:
                status, body = await self._send(adapter.query_request(task, apikey))
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._warn(task, adapter, "query failed", exc)
            return Unknown(f"unreachable: {str(exc) or type(exc).__name__}")
        return adapter.parse_query(status, body)

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
            self._warn(task, adapter, "storing result files failed", exc)
            return Unknown(f"storing result files failed: {exc}")
        stored = {**data, "data": entries} if isinstance(data, dict) else entries
        return Succeeded(stored, cost=outcome.cost)

    async def cancel(self, adapter: PlatformAdapter, task: Task, apikey: str) -> bool:
        """Ask the platform to cancel the remote task; False when it has no cancel or the
        request failed (the caller keeps the task counted and asks again later)."""
        req = adapter.cancel_request(task, apikey) if task.remote_id else None
        answer = await self._ask(adapter, task, req, "cancel")
        return answer is not None and 200 <= answer[0] < 300

    async def _ask(
        self, adapter: PlatformAdapter, task: Task, req: HttpRequest | None, what: str
    ) -> tuple[int, Any] | None:
        """Send ``req`` (None: nothing to ask) within the in-flight slots: its status and
        body, or None when there was nothing to ask or it failed (logged)."""
        if req is None:
            return None
        try:
            async with self._slots:
                return await self._send(req)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._warn(task, adapter, f"{what} failed", exc)
            return None

    async def running(self, adapter: PlatformAdapter, apikey: str) -> int | None:
        """How many tasks the account runs on the platform now; None: it cannot say (no
        such query, unreachable, no usable answer)."""
        state = await self.account(adapter, apikey)
        return None if state is None else state.tasks

    async def account(self, adapter: PlatformAdapter, apikey: str) -> AccountState | None:
        """What the platform says of the account now (its tasks, its balance); None: it
        cannot say (no such query, unreachable, no usable answer; logged)."""
        req = adapter.running_request(apikey)
        if req is None:
            return None
        try:
            async with self._slots:
                status, body = await self._send(req)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("%s: account status query failed: %r", adapter.name, exc)
            return None
        state = adapter.parse_account(status, body)
        if state is None:
            log.warning("%s: account status answer not usable (HTTP %s)", adapter.name, status)
        return state

    @staticmethod
    def _warn(task: Task, adapter: PlatformAdapter, what: str, exc: BaseException) -> None:
        log.warning(
            "task %s: %s %s: %r",
            task.task_id,
            adapter.name,
            what,
            exc,
            extra=ctx(task=task.task_id),
        )
