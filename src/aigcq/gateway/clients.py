"""Connected clients of this process and the delivery of their outbox messages.

Any process may finish a task; the process holding the client's socket is told through
the ``events`` channel and drains that client's outbox. A client that connects again
(here or on another process) replaces its older connection, so one socket at a time
receives a client's results, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from redis.asyncio import Redis
from starlette.websockets import WebSocket

from aigcq.delivery.outbox import DrainCursor, Outbox
from aigcq.delivery.presence import PRESENT_TTL_S, RENEW_S, Presence
from aigcq.observability import tracing
from aigcq.plumbing.background import every
from aigcq.plumbing.ws_frames import close_within, send_within
from aigcq.queue.keys import Keys
from aigcq.scheduler.traces import TaskTraces

log = logging.getLogger(__name__)

CLOSE_REPLACED = 4000

#: forget a progress subscriber only if it is still this connection (not a newer one)
_UNSUBSCRIBE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""


class ClientConnection:
    def __init__(
        self,
        ws: WebSocket,
        backend_id: str,
        *,
        principal: str,
        auto_ack: bool,
        progress: bool = False,
        queue_updates: bool = True,
        send_timeout_s: float = 10.0,
    ) -> None:
        """``principal``: whom its token speaks for (its quota's name); ``send_timeout_s``:
        how long one send (or the close) may wait on the peer."""
        self.ws = ws
        self.backend_id = backend_id
        self.principal = principal
        self.auto_ack = auto_ack
        self.progress = progress  # opted in to ``progress`` messages
        self.queue_updates = queue_updates  # not opted out of ``QUEUE_UPDATE`` messages
        self.send_timeout_s = send_timeout_s
        self.conn_id = uuid.uuid4().hex
        self.cursor = DrainCursor()
        self.dirty = False
        self.draining: asyncio.Task[None] | None = None
        self.send_lock = asyncio.Lock()
        #: no drain has ended on it yet: what it sends waited for the client (traced)
        self.fresh = True

    async def send(self, message: dict[str, Any]) -> None:
        """Write one message; a peer that does not take it within ``send_timeout_s`` (it
        stopped reading, or vanished) is dropped, and the message waits in Redis."""
        async with self.send_lock:
            try:
                await send_within(self.ws, orjson.dumps(message).decode(), self.send_timeout_s)
            except TimeoutError:
                log.info("client %s: not reading, dropped", self.backend_id)
                raise

    async def close(self, code: int, reason: str) -> None:
        """Close, waiting at most ``send_timeout_s`` for the peer's part of the handshake."""
        await close_within(self.ws, code, reason, self.send_timeout_s)


class ClientHub:
    def __init__(
        self, redis: Redis, keys: Keys, outbox: Outbox, traces: TaskTraces | None = None
    ) -> None:
        """``traces``: told of each result delivered (its ``settle`` span)."""
        self.redis = redis
        self.keys = keys
        self.outbox = outbox
        self.traces = traces
        self.conns: dict[str, ClientConnection] = {}
        self._sends: set[asyncio.Task[None]] = set()
        self._unsubscribe = redis.register_script(_UNSUBSCRIBE)
        self.presence = Presence(redis, keys)

    async def attach(self, conn: ClientConnection) -> None:
        old = self.conns.get(conn.backend_id)
        self.conns[conn.backend_id] = conn
        if old is not None:
            self._close(old)
        # Who wants progress, cluster-wide: scripts publish progress only for them.
        pipe = self.redis.pipeline(transaction=False)
        if conn.progress:
            pipe.hset(self.keys.progress, conn.backend_id, conn.conn_id)
        else:
            pipe.hdel(self.keys.progress, conn.backend_id)
        pipe.set(self.keys.online(conn.backend_id), conn.conn_id, ex=PRESENT_TTL_S)
        pipe.publish(self.keys.events, f"client:{conn.backend_id}:{conn.conn_id}")
        await pipe.execute()
        self.notify(conn.backend_id)

    def detach(self, conn: ClientConnection) -> None:
        if self.conns.get(conn.backend_id) is conn:
            del self.conns[conn.backend_id]
        if conn.progress:
            self._background(
                self._unsubscribe(keys=[self.keys.progress], args=[conn.backend_id, conn.conn_id])
            )
        self._background(self.presence.left(conn.backend_id, conn.conn_id))

    async def keep_present(self) -> None:
        """Renew the presence of this process's clients, for as long as it runs."""

        async def renew() -> None:
            await self.presence.renew([(b, c.conn_id) for b, c in self.conns.items()])

        await every(RENEW_S, renew, log, "client presence")

    def _background(self, aw: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(_quietly(aw))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    def replaced(self, backend_id: str, conn_id: str) -> None:
        """Another process accepted a newer connection for ``backend_id``."""
        conn = self.conns.get(backend_id)
        if conn is not None and conn.conn_id != conn_id:
            self.detach(conn)
            self._close(conn)

    def _close(self, conn: ClientConnection) -> None:
        """Close a replaced connection in the background: nobody waits on its peer."""
        log.info("client %s: replaced by a newer connection", conn.backend_id)
        self._background(conn.close(CLOSE_REPLACED, "replaced by a newer connection"))

    def notify(self, backend_id: str) -> None:
        conn = self.conns.get(backend_id)
        if conn is None:
            return
        if conn.draining is not None and not conn.draining.done():
            conn.dirty = True
            return
        conn.draining = asyncio.create_task(self._drain(conn))

    def progress(self, backend_id: str, message: dict[str, Any]) -> None:
        """Send a ``progress`` message if ``backend_id`` is connected here and opted in."""
        conn = self.conns.get(backend_id)
        if conn is not None and conn.progress:
            self.send_news(conn, message)

    def send_news(self, conn: ClientConnection, message: dict[str, Any]) -> None:
        """Send live news (never stored: a socket that does not take it misses it) in the
        background."""
        task = asyncio.create_task(_send_quietly(conn, message))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)

    def notify_all(self) -> None:
        for backend_id in list(self.conns):
            self.notify(backend_id)

    async def _drain(self, conn: ClientConnection) -> None:
        try:
            while True:
                conn.dirty = False
                await self.outbox.drain(
                    conn.backend_id, self._sender(conn), conn.cursor, auto_ack=conn.auto_ack
                )
                conn.fresh = False
                if not conn.dirty or self.conns.get(conn.backend_id) is not conn:
                    return
        except Exception as exc:  # the socket went away mid-send: the rest waits in Redis
            log.info("client %s: delivery paused: %r", conn.backend_id, exc)

    def _sender(self, conn: ClientConnection) -> Callable[[dict[str, Any]], Awaitable[None]]:
        """``conn.send``, each result it writes traced when tracing is on."""
        traces = self.traces
        if traces is None or not tracing.ON:
            return conn.send

        async def send(message: dict[str, Any]) -> None:
            began = time.time()
            await conn.send(message)
            traces.delivered(conn.backend_id, message, began, reconnected=conn.fresh)

        return send


async def _quietly(aw: Awaitable[Any]) -> None:
    try:
        await aw
    except Exception as exc:  # e.g. a stale progress entry: a few unread progress messages
        log.info("background step failed: %r", exc)


async def _send_quietly(conn: ClientConnection, message: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):  # a closed socket: news is not worth more
        await conn.send(message)
