"""The async client: one WebSocket to aigcq, reconnected with backoff, each result once.

It connects with ``ack=1``: the server keeps a result until it is acknowledged, and the
client acknowledges it as it hands it to the caller (:meth:`AsyncClient.result` or
:meth:`AsyncClient.events`). After a dropped socket the server sends every unacknowledged
result again; copies of results the client already has (same taskId) are dropped, so each
reaches the caller once. A result that replaces the one the client has is not a copy: the
end of a later attempt (``attempt``: an operator's retry, or the replay of a kept paid
result) or a late success (``late``: a paid run's result that came after its task was
reported failed ``UncertainSubmit``). It reaches the caller after the one it replaces
(:meth:`AsyncClient.result` answers it from then on). Unanswered ``generate``/``cancel``
requests are re-sent on reconnect (``generate`` is idempotent by taskId).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from aigcq.client.types import AigcqError, Event, Progress, Result, SubmitError
from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.cancel import cancel_and_wait

log = logging.getLogger(__name__)

# Close codes after which reconnecting cannot help.
CLOSE_FATAL = {4000: "Replaced", 4400: "JSONError", 4401: "AuthError"}
KEEP_HANDED = 10_000  # results remembered after hand-over, to drop late copies


@dataclass(slots=True)
class _Request:
    message: dict[str, Any]
    reply: asyncio.Future[dict[str, Any]]


class AsyncClient:
    """A business backend's connection: submit tasks, await results, follow progress.

    ``url`` is the client WebSocket (``ws://host:port/``); ``backoff`` the first and the
    longest pause between reconnection attempts. Use ``async with`` or :meth:`connect` /
    :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        token: str,
        backend_id: str,
        *,
        ack: bool = True,
        backoff: tuple[float, float] = (0.2, 10.0),
    ) -> None:
        query = {"token": token, "id": backend_id, "progress": "1"} | ({"ack": "1"} if ack else {})
        parts = urlsplit(url)
        self.url = urlunsplit(parts._replace(path=parts.path or "/", query=urlencode(query)))
        self.backend_id = backend_id
        self.ack = ack
        self.backoff = backoff
        self._ws: ClientConnection | None = None
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        self._failure: Exception | None = None
        self._refusal: dict[str, Any] | None = None  # an error reply without a taskId
        self._requests: dict[str, _Request] = {}
        self._fresh: dict[str, Result] = {}  # received, not yet handed over
        self._handed: OrderedDict[str, Result] = OrderedDict()
        self._waiters: dict[str, list[asyncio.Future[Result]]] = {}
        self._subscribers: dict[asyncio.Queue[Event | None], str | None] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- public API ----------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the WebSocket (raising if that fails); later drops are reconnected."""
        ws = await self._open()
        self._runner = asyncio.create_task(self._run(ws))

    async def close(self) -> None:
        self._closed = True
        if self._runner is not None:
            await cancel_and_wait([self._runner])
        self._fail(ConnectionError("client closed"))

    async def submit(
        self,
        platform: str,
        payload: dict[str, Any],
        *,
        task_id: str | None = None,
        aigc: str | None = None,
    ) -> str:
        """Submit a task; returns its taskId. Raises :class:`SubmitError` when refused."""
        task_id = task_id or uuid.uuid4().hex
        message = {"type": "generate", "taskId": task_id, "platform": platform, "payload": payload}
        if aigc is not None:
            message["AIGC"] = aigc
        reply = await self._request(task_id, message)
        if reply["type"] == "error":
            raise SubmitError.from_reply(reply)
        return task_id

    async def cancel(self, task_id: str) -> str:
        """Cancel a live task; returns its new state. Raises :class:`AigcqError` if refused."""
        reply = await self._request(task_id, {"type": "cancel", "taskId": task_id})
        if reply["type"] == "error":
            raise AigcqError.from_reply(reply)
        return str(reply.get("state", ""))

    async def result(self, task_id: str, timeout: float | None = None) -> Result:
        """The task's result, once it arrives (``TimeoutError`` after ``timeout`` s)."""
        got = self._fresh.get(task_id) or self._handed.get(task_id)
        if got is None:
            self._check()
            waiter: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(task_id, []).append(waiter)
            try:
                async with asyncio.timeout(timeout):
                    got = await waiter
            finally:
                self._forget(task_id, waiter)
        self._hand(got)
        return got

    async def events(self, task_id: str | None = None) -> AsyncIterator[Event]:
        """Progress and results as they arrive (of one task, or all); results not yet
        handed over come first. Ends when the client is closed."""
        self._check()
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        for result in list(self._fresh.values()):
            if task_id in (None, result.task_id):
                queue.put_nowait(result)
        self._subscribers[queue] = task_id
        try:
            while (event := await queue.get()) is not None:
                if isinstance(event, Result):
                    self._hand(event)
                yield event
        finally:
            del self._subscribers[queue]
        if not self._closed and self._failure is not None:
            raise self._failure

    # ---- requests ------------------------------------------------------------------------

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._runner is None:
            raise RuntimeError("not connected: call connect() first")

    async def _request(self, task_id: str, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message`` and await its reply (one request per taskId at a time)."""
        while (busy := self._requests.get(task_id)) is not None and not busy.reply.done():
            await asyncio.wait([busy.reply])
        self._check()
        req = _Request(message, asyncio.get_running_loop().create_future())
        self._requests[task_id] = req
        ws = self._ws  # None: the request is sent once the connection is back
        try:
            if ws is not None:
                await _send(ws, message)
            return await req.reply
        finally:
            if self._requests.get(task_id) is req:
                del self._requests[task_id]

    # ---- the connection ------------------------------------------------------------------

    async def _open(self) -> ClientConnection:
        return await connect(self.url, max_size=None, close_timeout=2)

    async def _run(self, ws: ClientConnection) -> None:
        try:
            while True:
                code = await self._serve(ws)
                if code in CLOSE_FATAL:
                    self._fail(self._refused(code))
                    return
                ws = await self._reconnect()
        except Exception as exc:  # a bug must not leave callers waiting forever
            log.exception("client %s: connection loop failed", self.backend_id)
            self._fail(exc)

    async def _serve(self, ws: ClientConnection) -> int | None:
        """Read messages until the socket closes; returns its close code."""
        self._ws, self._refusal = ws, None
        unanswered = [r.message for r in self._requests.values()]  # taken with _ws set
        log.info("client %s: connected", self.backend_id)
        try:
            for message in unanswered:
                await _send(ws, message)
            async for raw in ws:
                self._on_message(orjson.loads(raw))
        except ConnectionClosed:
            pass
        finally:
            self._ws = None
            await ws.close()
        log.info("client %s: disconnected (code %s)", self.backend_id, ws.close_code)
        return ws.close_code

    async def _reconnect(self) -> ClientConnection:
        delay = self.backoff[0]
        while True:
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            try:
                return await self._open()
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                log.info("client %s: reconnect failed: %r", self.backend_id, exc)
            delay = min(delay * 2, self.backoff[1])

    def _refused(self, code: int) -> AigcqError:
        if self._refusal is not None:
            return AigcqError.from_reply(self._refusal)
        return AigcqError(CLOSE_FATAL[code], "connection closed by aigcq")

    def _fail(self, exc: Exception) -> None:
        """The client is done: every pending call raises ``exc``; event streams end."""
        self._failure = self._failure or exc
        pending: list[asyncio.Future[Any]] = [r.reply for r in self._requests.values()]
        pending += [w for ws in self._waiters.values() for w in ws]
        for future in pending:
            if not future.done():
                future.set_exception(self._failure)
        self._waiters.clear()
        for queue in self._subscribers:
            queue.put_nowait(None)

    # ---- incoming messages ---------------------------------------------------------------

    def _on_message(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "result":
            self._on_result(msg)
        elif kind == "progress":
            self._publish(Progress.from_message(msg))
        elif kind in ("submitted", "cancelled", "error"):
            self._on_reply(msg)

    def _on_reply(self, msg: dict[str, Any]) -> None:
        req = self._requests.get(msg.get("taskId") or "")
        if req is not None and not req.reply.done():
            req.reply.set_result(msg)
        elif msg["type"] == "error":
            self._refusal = msg
            log.warning("client %s: %s %s", self.backend_id, msg.get("code"), msg.get("detail"))

    def _on_result(self, msg: dict[str, Any]) -> None:
        task_id, entry_id = msg["taskId"], msg.get("id", "")
        held = self._fresh.get(task_id) or self._handed.get(task_id)
        if held is not None and held.replaced_by(msg):
            self._replace(held)
        elif held is not None:  # a copy: acknowledge it unless it is the one still to hand over
            if task_id in self._handed or held.id != entry_id:
                self._acknowledge(entry_id)
            log.debug(
                "client %s: dropped a copy of %s's result",
                self.backend_id,
                task_id,
                extra=ctx(task=task_id),
            )
            return
        result = Result.from_message(msg)
        self._fresh[task_id] = result
        for waiter in self._waiters.pop(task_id, []):
            if not waiter.done():
                waiter.set_result(result)
        self._publish(result)

    def _replace(self, old: Result) -> None:
        """A later attempt's end or a late success replaces ``old``: it is over
        (acknowledged, if it was not handed over yet), and the new one is handed over as a
        new result."""
        log.info(
            "client %s: %s (attempt %s, %s) has a new result",
            self.backend_id,
            old.task_id,
            old.attempt,
            old.status,
            extra=ctx(task=old.task_id),
        )
        if self._fresh.pop(old.task_id, None) is not None:
            self._acknowledge(old.id)
        self._handed.pop(old.task_id, None)

    def _publish(self, event: Event) -> None:
        for queue, wanted in self._subscribers.items():
            if wanted in (None, event.task_id):
                queue.put_nowait(event)

    def _forget(self, task_id: str, waiter: asyncio.Future[Result]) -> None:
        waiters = self._waiters.get(task_id, [])
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            self._waiters.pop(task_id, None)

    # ---- hand-over and acknowledgement -------------------------------------------------

    def _hand(self, result: Result) -> None:
        """``result`` reaches the caller: remember it and acknowledge it (once)."""
        if self._fresh.get(result.task_id) is not result:  # handed, or replaced since
            return
        del self._fresh[result.task_id]
        self._handed[result.task_id] = result
        if len(self._handed) > KEEP_HANDED:
            self._handed.popitem(last=False)
        self._acknowledge(result.id)

    def _acknowledge(self, entry_id: str) -> None:
        """Best effort: an ack lost with the socket means the result comes again."""
        ws = self._ws
        if self.ack and ws is not None and entry_id:
            self._spawn(_send(ws, {"type": "ack", "id": entry_id}))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _send(ws: ClientConnection, message: dict[str, Any]) -> None:
    """Send, ignoring a closed socket (what matters is re-sent after reconnecting)."""
    with contextlib.suppress(ConnectionClosed):
        await ws.send(orjson.dumps(message).decode())
