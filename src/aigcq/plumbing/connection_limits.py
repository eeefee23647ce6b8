"""Bounds of every HTTP and WebSocket surface (issue 25 item 9): idle, slow and surplus
connections are let go instead of being held forever.

uvicorn times out an idle keep-alive connection only *after* a response, and has no limit
on how long a request's head may take: a socket that sends nothing, or a byte a minute
(slowloris), is held until the peer leaves, and enough of them exhaust the process's file
descriptors (accept then fails and every new connection waits). Its ``limit_concurrency``
counts those idle sockets too, so a health probe behind them would get 503. Hence
:class:`BoundedHttpProtocol`, uvicorn's httptools protocol with:

* a **head timeout**: the request line and headers must arrive within
  ``http_header_timeout_s`` of the connection (or of the next request's first byte on a
  keep-alive connection); else the connection is closed (408 when part of a request came);
* a **head size limit**: ``http_max_header_bytes`` of request line and headers, else 431;
* a **connection limit** per process, ``max_connections`` (HTTP and WebSocket together,
  at most the file-descriptor limit minus ``FD_RESERVE``): a request on a connection
  beyond it gets 503 with ``Retry-After`` and the connection is closed, except the health
  probes (:data:`~aigcq.plumbing.http_limits.PROBES`), which are still answered; beyond
  it by more than :data:`PROBE_RESERVE` a connection is answered 503 and closed as soon as
  it is accepted.

``timeout_keep_alive`` and the WebSocket ping interval/timeout are uvicorn's own, set from
the same settings (:class:`~aigcq.plumbing.http_limits.HttpLimits`) by
:func:`bounded_config`. The table is in ``docs/operations.md`` ("Bounded surfaces").
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aigcq.plumbing.http_limits import PROBE_RESERVE, PROBES, HttpLimits

log = logging.getLogger(__name__)

_WARN_EVERY_S = 10.0


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head timeout, a head size limit and a
    connection limit (see the module). :func:`bounded_protocol` sets :attr:`limits`."""

    limits: HttpLimits
    limit: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._head_started = False  # some bytes of the current request's head came
        self._refused = False

    # ---- the connection --------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limit + PROBE_RESERVE:
            self._refuse(503, "too many connections")
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._head_started = True
        super().data_received(data)

    def handle_websocket_upgrade(self) -> None:
        if not self._refused:
            super().handle_websocket_upgrade()

    # ---- the parser's callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._head_bytes = 0
        if self._head_timer is None:  # the next request on a keep-alive connection
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        if self._counted(url):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._counted(name, value):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._cancel_head_timer()
        self._head_started = False
        over = len(self.connections) > self.limit
        if over and self.url.split(b"?", 1)[0].decode("latin-1") not in PROBES:
            self._refuse(503, "too many connections")
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    # ---- the bounds -------------------------------------------------------------------

    def _counted(self, *parts: bytes) -> bool:
        """Count head bytes; False (refused with 431) once over the limit."""
        if self._refused:
            return False
        self._head_bytes += sum(len(p) for p in parts)
        if self._head_bytes > self.limits.http_max_header_bytes:
            self._refuse(431, "request head too large")
            return False
        return True

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(
            self.limits.http_header_timeout_s, self._head_timed_out
        )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._refused or self.transport.is_closing():
            return
        if self._head_started:  # part of a request: say why (RFC 9110 allows it)
            self._refuse(408, "request head not received in time")
        else:  # never a byte: just let it go
            self._refused = True
            self.transport.close()
            _warn(f"closed a silent connection after {self.limits.http_header_timeout_s:g} s")

    def _refuse(self, status: int, why: str) -> None:
        """Answer ``status`` (a short text naming the setting) and close."""
        self._refused = True
        self._cancel_head_timer()
        answer = self.limits.refusal(status, why)
        self.transport.write(answer)
        self.transport.close()
        text = answer.partition(b"\r\n\r\n")[2].decode().strip()
        _warn(f"refused a connection, {status}: {text}")


_warned = {"at": 0.0, "count": 0}


def _warn(message: str) -> None:
    """Log ``message`` at most every 10 s, with how many connections were let go since."""
    _warned["count"] += 1
    now = time.monotonic()
    if now - _warned["at"] < _WARN_EVERY_S:
        return
    count, _warned["count"], _warned["at"] = _warned["count"], 0, now
    log.warning("%s (%d connection(s) let go since the last such line)", message, count)


def bounded_protocol(limits: HttpLimits) -> type[BoundedHttpProtocol]:
    """The protocol class for a server with these limits."""

    class Bounded(BoundedHttpProtocol):
        pass

    Bounded.limits, Bounded.limit = limits, limits.connection_limit()
    return Bounded


def bounded_config(app: Any, limits: HttpLimits, **options: Any) -> uvicorn.Config:
    """A uvicorn ``Config`` for ``app`` with every bound of ``limits``; ``options`` as
    uvicorn's (host, port, log_config …)."""
    return uvicorn.Config(
        app,
        http=bounded_protocol(limits),
        timeout_keep_alive=limits.http_keepalive_s,
        ws_ping_interval=limits.ws_ping_interval_s,
        ws_ping_timeout=limits.ws_ping_timeout_s,
        **options,
    )
