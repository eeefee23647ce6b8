"""The bridge's link to aigcq: connect, REGISTER, HEARTBEAT, answer PING, take TASK_ASSIGN.

Reconnects forever with exponential backoff and jitter (1, 2, 4 … s, times 0.5–1). While
aigcq cannot be reached (connection refused or reset, no answer, a proxy's 502/503/504, the
connection lost) the back-off is capped at ``reconnect_down_max`` (2 s): a server coming
back is noticed within that, and a refused TCP connect costs the server nothing. When aigcq
answers and refuses the bridge (another HTTP status, a close for a bad token or a flood) it
grows to ``reconnect_max`` (60 s; seed 002: at least once a minute). Once REGISTER is sent,
``on_registered`` runs (the bridge re-sends its undelivered TASK_ENDs at once).
:meth:`HubLink.set_server` switches to a new address at run time and reconnects at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from aigcq.observability.jsonlog import ctx
from aigcq.plumbing.background import Spawner, backoff_delay
from aigcq.plumbing.cancel import cancel_and_wait
from aigcq.wire.bridge import (
    CLOSE_AUTH,
    CLOSE_FLOOD,
    BridgeMessage,
    ErrorMessage,
    HeartbeatMessage,
    PingMessage,
    PongMessage,
    ProtocolError,
    RegisterMessage,
    TaskAssignData,
    TaskAssignMessage,
    TaskCancelData,
    TaskCancelMessage,
    encode,
    parse_bridge_message,
)

log = logging.getLogger(__name__)

#: A connection that lasted this long resets the backoff.
STABLE_AFTER_S = 10.0
#: HTTP answers to the upgrade that mean aigcq is not there (a proxy in front of it)
DOWN_STATUSES = frozenset({502, 503, 504})
#: closes by the hub that refuse this bridge (its token, its flood): back off long
REFUSING_CLOSES = frozenset({CLOSE_AUTH, CLOSE_FLOOD})


def with_token(url: str, token: str) -> str:
    """``url`` with ``?token=`` set (kept as is without a token)."""
    if not token:
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "token"] + [("token", token)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def redact(url: str) -> str:
    """``url`` without its query string (which may hold the token), for logs."""
    return urlunsplit(urlsplit(url)._replace(query=""))


@dataclass(eq=False)
class HubLink:
    """One outgoing WebSocket to aigcq, kept up for the bridge's lifetime."""

    url: str
    token: str = field(repr=False)
    bridge_id: str
    heartbeat: float
    reconnect_max: float
    register: Callable[[], RegisterMessage]
    heartbeat_message: Callable[[], HeartbeatMessage]
    on_assign: Callable[[TaskAssignData], Coroutine[object, object, None]]
    on_cancel: Callable[[TaskCancelData], Coroutine[object, object, None]]
    reconnect_down_max: float = 2.0
    on_registered: Callable[[], None] = lambda: None
    state: str = field(init=False, default="disconnected")
    since: float = field(init=False, default_factory=time.time)
    last_error: str = field(init=False, default="")
    _ws: ClientConnection | None = field(init=False, default=None)
    _changed: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _handlers: Spawner = field(init=False, default_factory=Spawner)

    def _set_state(self, state: str) -> None:
        self.state, self.since = state, time.time()

    async def set_server(self, url: str) -> None:
        """Use ``url`` from now on; drops the current connection to reconnect at once."""
        log.info(
            "bridge %s: server changed to %s",
            self.bridge_id,
            redact(url),
            extra=ctx(bridge=self.bridge_id),
        )
        self.url = url
        self._changed.set()
        if self._ws is not None:
            await self._ws.close()

    async def send(self, msg: BridgeMessage) -> bool:
        """Send if connected; False when there is no connection (the message is dropped)."""
        ws = self._ws
        if ws is None:
            return False
        try:
            await ws.send(encode(msg))
        except WebSocketException:
            return False
        return True

    async def close(self) -> None:
        """Cancel the running TASK_ASSIGN handlers (the run loop is cancelled by its owner)."""
        await cancel_and_wait(list(self._handlers.tasks))

    async def run(self) -> None:
        """Connect, serve, reconnect — forever."""
        attempt = 0
        while True:
            started = time.monotonic()
            refused = await self._connect_once()
            if time.monotonic() - started >= STABLE_AFTER_S:
                attempt = 0
            if not self._changed.is_set():
                cap = self.reconnect_max
                if not refused:  # not there (yet): look again soon
                    cap = min(cap, self.reconnect_down_max)
                delay = backoff_delay(attempt, cap)
                attempt += 1
                log.info(
                    "bridge %s: reconnecting in %.1fs",
                    self.bridge_id,
                    delay,
                    extra=ctx(bridge=self.bridge_id),
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), delay)
            if self._changed.is_set():  # a new address: try it at once
                self._changed.clear()
                attempt = 0

    async def _connect_once(self) -> bool:
        """One connection, served until it ends; True when aigcq answered and refused the
        bridge, False when it could not be reached or the connection was lost."""
        url = self.url
        refused = False
        self._set_state("connecting")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            async with connect(
                with_token(url, self.token), additional_headers=headers, max_size=64 << 20
            ) as ws:
                if url != self.url:  # changed during the handshake
                    return False
                self._ws = ws
                self._set_state("connected")
                self.last_error = ""
                await ws.send(encode(self.register()))
                log.info(
                    "bridge %s: connected to %s, REGISTER sent",
                    self.bridge_id,
                    redact(url),
                    extra=ctx(bridge=self.bridge_id),
                )
                self.on_registered()
                await self._session(ws)
                refused = ws.close_code in REFUSING_CLOSES
        except InvalidStatus as e:
            self.last_error = f"refused: HTTP {e.response.status_code}"
            refused = e.response.status_code not in DOWN_STATUSES
        except (OSError, WebSocketException, TimeoutError) as e:
            self.last_error = str(e) or type(e).__name__
        finally:
            self._ws = None
            self._set_state("disconnected")
        reason = self.last_error or "closed"
        log.warning(
            "bridge %s: disconnected from %s: %s",
            self.bridge_id,
            redact(url),
            reason,
            extra=ctx(bridge=self.bridge_id),
        )
        return refused

    async def _session(self, ws: ClientConnection) -> None:
        beats = asyncio.create_task(self._beat(ws), name=f"heartbeat-{self.bridge_id}")
        try:
            async for raw in ws:
                await self._handle(ws, raw)
        finally:
            await cancel_and_wait([beats])
        if ws.close_code not in (None, 1000, 1001):
            self.last_error = f"closed: {ws.close_code} {ws.close_reason}"

    async def _beat(self, ws: ClientConnection) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            await ws.send(encode(self.heartbeat_message()))

    async def _handle(self, ws: ClientConnection, raw: str | bytes) -> None:
        try:
            msg = parse_bridge_message(raw, sender="hub")
        except ProtocolError as e:
            log.warning(
                "bridge %s: bad message from hub: %s",
                self.bridge_id,
                e,
                extra=ctx(bridge=self.bridge_id),
            )
            return
        if isinstance(msg, PingMessage):
            await ws.send(encode(PongMessage()))
        elif isinstance(msg, TaskAssignMessage):
            self._handlers(self.on_assign(msg.data))
        elif isinstance(msg, TaskCancelMessage):
            self._handlers(self.on_cancel(msg.data))
        elif isinstance(msg, ErrorMessage):
            log.warning(
                "bridge %s: hub error %s: %s",
                self.bridge_id,
                msg.data.code,
                msg.data.msg,
                extra=ctx(bridge=self.bridge_id),
            )
