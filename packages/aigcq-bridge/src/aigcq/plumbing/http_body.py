"""Reading an HTTP request body with a size limit, on every HTTP surface of every process.

A body is read only after the request is authenticated (where the credential is outside
the body), and never whole before its size is known: a ``Content-Length`` over the limit
is refused before any byte is read, and a chunked body as soon as the bytes seen so far
pass the limit, so the answer (413) leaves while the sender is still sending and at most
``limit`` bytes are ever held.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope


class BodyTooLarge(Exception):
    """The body is over the limit (answer 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes")
        self.limit = limit


class Disconnected(Exception):
    """The sender went away before its body arrived: nothing to answer."""


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The body of a plain ASGI request of at most ``limit`` bytes."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            _check_length(value.decode("latin-1"), limit)
    return await _collect(_chunks(receive), limit)


async def request_body(request: Request, limit: int) -> bytes:
    """The body of a Starlette request of at most ``limit`` bytes."""
    _check_length(request.headers.get("content-length", ""), limit)
    try:
        return await _collect(request.stream(), limit)
    except ClientDisconnect as exc:
        raise Disconnected from exc


def _check_length(declared: str, limit: int) -> None:
    if declared.isascii() and declared.isdigit() and len(declared) < 20 and int(declared) > limit:
        raise BodyTooLarge(limit)


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Disconnected
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


async def _collect(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)
