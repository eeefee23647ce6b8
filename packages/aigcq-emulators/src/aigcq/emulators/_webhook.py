"""A lean HTTP/1.1 JSON POST client with kept-alive connections, for emulator webhooks.

httpx spends milliseconds of CPU per request (its pool re-checks every connection on each
request), which made webhooks the emulator's bottleneck at thousands of tasks a second.
This client writes the request and reads the answer on asyncio streams: about 0.1 ms.
The URL is sent exactly as given (path and query string are not re-encoded).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

_Origin = tuple[str, str, int]
_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class WebhookPoster:
    """POSTs one request at a time over per-origin kept-alive connections.

    Not shared between tasks: give each concurrent sender its own poster.
    """

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._idle: dict[_Origin, _Connection] = {}
        self._ssl: ssl.SSLContext | None = None

    async def post(self, url: str, body: bytes) -> int:
        """POST ``body`` as JSON to ``url`` and return the HTTP status.

        Raises OSError (including TimeoutError), EOFError or ValueError when no answer came.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        origin = (
            parts.scheme,
            parts.hostname,
            parts.port or (443 if parts.scheme == "https" else 80),
        )
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = (
            f"POST {target} HTTP/1.1\r\nHost: {parts.netloc.rpartition('@')[2]}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        request = head.encode() + body
        async with asyncio.timeout(self._timeout_s):
            reused = self._idle.pop(origin, None)
            if reused is not None:
                try:
                    return await self._exchange(origin, reused, request)
                except (OSError, EOFError):
                    pass  # the server closed the idle connection: use a new one
            return await self._exchange(origin, await self._open(origin), request)

    def close(self) -> None:
        for _, writer in self._idle.values():
            writer.close()
        self._idle.clear()

    async def _open(self, origin: _Origin) -> _Connection:
        scheme, host, port = origin
        if scheme == "http":
            return await asyncio.open_connection(host, port)
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return await asyncio.open_connection(host, port, ssl=self._ssl)

    async def _exchange(self, origin: _Origin, connection: _Connection, request: bytes) -> int:
        """Send ``request``, read the whole answer, keep the connection if allowed."""
        reader, writer = connection
        try:
            writer.write(request)
            await writer.drain()
            status, keep_alive = await _read_response(reader)
        except BaseException:
            writer.close()
            raise
        if keep_alive:
            self._idle[origin] = connection
        else:
            writer.close()
        return status


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response; return its status and whether the connection may be reused."""
    status_line = await reader.readline()
    if not status_line:
        raise EOFError("connection closed before the answer")
    version, status_text, *_ = [*status_line.split(None, 2), b""]
    status = int(status_text)
    keep_alive = version == b"HTTP/1.1"
    length, chunked = None, False
    while (line := await reader.readline()) not in (b"\r\n", b"\n"):
        if not line:
            raise EOFError("connection closed inside the headers")
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value
        elif name == b"connection":
            keep_alive = value == b"keep-alive" or (keep_alive and value != b"close")
    if chunked:
        await _skip_chunks(reader)
    elif length is not None:
        await reader.readexactly(length)
    elif status not in (204, 304):
        await reader.read()  # the body runs to the end of the connection
        keep_alive = False
    return status, keep_alive


async def _skip_chunks(reader: asyncio.StreamReader) -> None:
    while size := int((await reader.readline()).split(b";")[0], 16):
        await reader.readexactly(size + 2)
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass  # trailers


class WebhookOutbox:
    """Webhooks to send, by a few sender tasks off the request path; a failed one is sent
    again after a backoff (``retries`` times). Counts ``webhooks_delivered`` and
    ``webhooks_failed`` in ``counts``."""

    def __init__(
        self, counts: Counter[str], *, retries: int, backoff_s: float, timeout_s: float
    ) -> None:
        self.counts = counts
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        #: (url, body, tries so far)
        self._queue: asyncio.Queue[tuple[str, bytes, int]] = asyncio.Queue()

    def put(self, url: str, body: bytes) -> None:
        self._queue.put_nowait((url, body, 0))

    @asynccontextmanager
    async def sending(self, senders: int) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(self._send()) for _ in range(senders)]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _send(self) -> None:
        loop = asyncio.get_running_loop()
        poster = WebhookPoster(self.timeout_s)
        try:
            while True:
                url, body, tries = await self._queue.get()
                problem = await _post(poster, url, body)
                if problem is None:
                    self.counts["webhooks_delivered"] += 1
                elif tries < self.retries:
                    logger.debug("webhook to %s failed (try %d): %s", url, tries + 1, problem)
                    delay = self.backoff_s * 2**tries
                    loop.call_later(delay, self._queue.put_nowait, (url, body, tries + 1))
                else:
                    self.counts["webhooks_failed"] += 1
                    logger.warning("webhook to %s given up after %d tries", url, tries + 1)
        finally:
            poster.close()


async def _post(poster: WebhookPoster, url: str, body: bytes) -> str | None:
    """POST a webhook body; None on a 2xx answer, else what went wrong."""
    try:
        status = await poster.post(url, body)
    except (OSError, EOFError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if 200 <= status < 300 else f"HTTP {status}"
