"""The bridge's HTTP/1.1 server: asyncio streams speaking HTTP through h11 (the sans-IO
HTTP/1.1 library httpx already brings), so a GPU host installs no ASGI server. Generic and
small: a handler ``async (Request) -> Response``, one request at a time per connection,
connections kept alive.

Bounded as the server's uvicorn surfaces are (:mod:`aigcq.plumbing.connection_limits`),
with the same settings (:class:`~aigcq.plumbing.http_limits.HttpLimits`):

* a **head timeout**: the request line and headers must arrive within
  ``http_header_timeout_s`` of the connection (or of the next request's first byte on a
  keep-alive connection); else the connection is closed (408 when part of a request came);
* a **head size limit**: ``http_max_header_bytes`` of request line and headers, else 431;
* **keep-alive**: a connection idle ``http_keepalive_s`` after a response is closed;
* a **connection limit**, ``connection_limit()``: a request on a connection beyond it gets
  503 with ``Retry-After`` and the connection is closed, except the health probes
  (:data:`~aigcq.plumbing.http_limits.PROBES`); beyond it by more than ``PROBE_RESERVE`` a
  connection is answered 503 as soon as it is accepted;
* **bodies** are read by the handler only, with a limit (:meth:`Request.body`); a response
  before the body was read closes the connection.

A malformed request gets 400 and its connection is closed; the server serves on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote

import h11

from aigcq.plumbing.http_body import Disconnected, check_length, collect
from aigcq.plumbing.http_limits import PROBE_RESERVE, PROBES, HttpLimits

log = logging.getLogger(__name__)

_READ = 64 << 10
_FILE_CHUNK = 1 << 20
_WARN_EVERY_S = 10.0


@dataclass
class Response:
    """``body``: bytes, or a file sent in chunks read off the event loop. The server adds
    ``Content-Length`` (and ``Connection: close`` when it will close)."""

    status: int
    body: bytes | Path = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    #: of a file body, the bytes sent (first, last), both included; None: all of it
    span: tuple[int, int] | None = None


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """The one byte range a ``Range`` header asks of ``size`` bytes, as (first, last):
    ``bytes=a-b``, ``bytes=a-`` or ``bytes=-n``. None: the whole (no header, or one not
    served here: several ranges, another unit, bad syntax, which RFC 9110 says to ignore).
    ``ValueError``: a range none of those bytes satisfies (416)."""
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash or not (first.isdigit() or last.isdigit()):
        return None
    if not first.isdigit():  # the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            raise ValueError(header)
        return max(size - n, 0), size - 1
    start, end = int(first), int(last) if last.isdigit() else size - 1
    if last.isdigit() and end < start:
        return None
    if start >= size:
        raise ValueError(header)
    return start, min(end, size - 1)


def json_response(content: object, status: int = 200, *headers: tuple[str, str]) -> Response:
    """``content`` as compact UTF-8 JSON."""
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(status, body.encode(), [("content-type", "application/json"), *headers])


class Request:
    """A request's head: ``method``, ``path`` (percent-decoded), ``query`` (as sent),
    ``headers`` (lower-case names); its body is read on demand by :meth:`body`."""

    def __init__(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        chunks: AsyncIterator[bytes],
    ) -> None:
        raw_path, _, self.query = target.partition("?")
        self.method, self.path, self.headers = method, unquote(raw_path), headers
        self._chunks = chunks

    async def body(self, limit: int) -> bytes:
        """The body, :class:`~aigcq.plumbing.http_body.BodyTooLarge` past ``limit`` bytes
        (a declared ``Content-Length`` before any is read), ``Disconnected`` if the sender
        went away."""
        check_length(self.headers.get("content-length", ""), limit)
        return await collect(self._chunks, limit)


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    """``handler`` served on ``host:port`` with the bounds of ``limits``; ``name`` in its
    log lines (e.g. ``bridge <id>``)."""

    def __init__(self, handler: Handler, limits: HttpLimits, name: str = "http") -> None:
        self.handler, self.limits, self.name = handler, limits, name
        self.limit = limits.connection_limit()
        self.connections: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._warned_at, self._let_go = 0.0, 0

    async def start(self, host: str, port: int) -> int:
        """Listen (``OSError`` if it cannot); the port bound."""
        self._server = await asyncio.start_server(self._accepted, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is None:
            return  # never listened
        self._server.close()
        for task in self.connections:
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            if len(self.connections) > self.limit + PROBE_RESERVE:
                self.refuse(writer, 503, "too many connections")
            else:
                await _Connection(self, reader, writer).serve()
        except (ConnectionError, h11.ProtocolError):
            pass  # the peer went away, or broke HTTP mid-body: nothing more to say
        except asyncio.CancelledError:  # the server closes: this connection ends with it
            pass  # (ended, not cancelled: asyncio 3.11 logs a cancelled one as an error)
        finally:
            self.connections.discard(task)
            writer.close()

    def refuse(self, writer: asyncio.StreamWriter, status: int, why: str) -> None:
        """Answer ``status`` (a short text naming the setting); the connection then closes."""
        answer = self.limits.refusal(status, why)
        writer.write(answer)
        text = answer.partition(b"\r\n\r\n")[2].decode().strip()
        self.warn(f"refused a connection, {status}: {text}")

    def warn(self, message: str) -> None:
        """Log ``message`` at most every 10 s, with how many connections were let go since."""
        self._let_go += 1
        now = time.monotonic()
        if now - self._warned_at < _WARN_EVERY_S:
            return
        count, self._let_go, self._warned_at = self._let_go, 0, now
        log.warning("%s: %s (%d connection(s) let go since)", self.name, message, count)


class _Connection:
    """One accepted connection: requests in turn until it closes."""

    def __init__(
        self, server: HttpServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server, self.reader, self.writer = server, reader, writer
        limit = server.limits.http_max_header_bytes
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limit)

    async def serve(self) -> None:
        first = True
        while (head := await self._head(first)) is not None:
            first = False
            target = head.target.decode("latin-1")
            over = len(self.server.connections) > self.server.limit
            if over and target.partition("?")[0] not in PROBES:
                self.server.refuse(self.writer, 503, "too many connections")
                return
            headers: dict[str, str] = {}
            for name, value in head.headers:
                key = name.decode("latin-1")
                text = value.decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
            request = Request(head.method.decode("latin-1"), target, headers, self._body())
            try:
                response = await self.server.handler(request)
            except Disconnected:
                return
            except Exception:
                log.exception("%s: %s %s failed", self.server.name, request.method, request.path)
                plain = [("content-type", "text/plain; charset=utf-8")]
                response = Response(500, b"Internal Server Error", plain)
            await self._respond(response)
            if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
                return
            self.h11.start_next_cycle()

    async def _head(self, first: bool) -> h11.Request | None:
        """The next request's head within the head timeout (the first from the connection,
        the next from its first byte, after at most ``http_keepalive_s`` idle); ``None``
        when the connection is to close."""
        limits, loop = self.server.limits, asyncio.get_running_loop()
        begun = bool(self.h11.trailing_data[0])  # bytes of it came with the last request
        deadline = loop.time() + limits.http_header_timeout_s if first or begun else None
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                if exc.error_status_hint == 431:  # still incomplete past the limit
                    self.server.refuse(self.writer, 431, "request head too large")
                else:
                    self._malformed(str(exc))
                return None
            if isinstance(event, h11.Request):
                if _head_size(event) <= limits.http_max_header_bytes:
                    return event
                self.server.refuse(self.writer, 431, "request head too large")
                return None
            if event is not h11.NEED_DATA:  # the peer closed between requests
                return None
            try:
                if deadline is None:
                    async with asyncio.timeout(limits.http_keepalive_s):
                        data = await self.reader.read(_READ)
                    deadline = loop.time() + limits.http_header_timeout_s
                else:
                    async with asyncio.timeout_at(deadline):
                        data = await self.reader.read(_READ)
            except TimeoutError:
                if begun:  # part of a request: say why (RFC 9110 allows it)
                    self.server.refuse(self.writer, 408, "request head not received in time")
                elif deadline is not None:  # never a byte: just let it go
                    timeout = limits.http_header_timeout_s
                    self.server.warn(f"closed a silent connection after {timeout:g} s")
                return None
            begun = begun or bool(data)
            self.h11.receive_data(data)

    def _malformed(self, why: str) -> None:
        body = f"malformed request: {why}\n".encode()
        self.writer.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )

    async def _body(self) -> AsyncIterator[bytes]:
        if self.h11.they_are_waiting_for_100_continue:
            self._send(h11.InformationalResponse(status_code=100, headers=[]))
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise Disconnected from exc
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            elif event is h11.NEED_DATA and (data := await self.reader.read(_READ)):
                self.h11.receive_data(data)
            else:
                raise Disconnected

    async def _respond(self, response: Response) -> None:
        # what of the request's body already came is skipped; more unread closes it
        while self.h11.their_state is h11.SEND_BODY and self.h11.next_event() is not h11.NEED_DATA:
            pass
        body, first = response.body, 0
        if isinstance(body, Path):
            whole = (await asyncio.to_thread(body.stat)).st_size
            first, last = response.span or (0, whole - 1)
            size = last - first + 1
        else:
            size = len(body)
        headers = [*response.headers, ("content-length", str(size))]
        if self.h11.their_state is not h11.DONE:
            headers.append(("connection", "close"))
        phrase = HTTPStatus(response.status).phrase.encode()
        self._send(h11.Response(status_code=response.status, headers=headers, reason=phrase))
        if isinstance(body, Path):
            async for chunk in _file_chunks(body, first, size):
                self._send(h11.Data(data=chunk))
                await self.writer.drain()
        elif body:
            self._send(h11.Data(data=body))
        self._send(h11.EndOfMessage())
        await self.writer.drain()

    def _send(self, event: h11.Event) -> None:
        self.writer.write(self.h11.send(event) or b"")


def _head_size(head: h11.Request) -> int:
    """The bytes of a request's target and headers (a whole head may come in one read)."""
    return len(head.target) + sum(len(name) + len(value) for name, value in head.headers)


async def _file_chunks(path: Path, start: int, length: int) -> AsyncIterator[bytes]:
    """``length`` bytes of ``path`` from ``start``, each chunk read in a thread."""
    file: BinaryIO = await asyncio.to_thread(path.open, "rb")
    try:
        await asyncio.to_thread(file.seek, start)
        while length > 0 and (
            chunk := await asyncio.to_thread(file.read, min(_FILE_CHUNK, length))
        ):
            length -= len(chunk)
            yield chunk
    finally:
        file.close()
