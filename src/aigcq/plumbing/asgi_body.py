"""An ASGI (Starlette) request's body read with a size limit: :mod:`aigcq.plumbing.http_body`
on the server's apps."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope

from aigcq.plumbing.http_body import Disconnected, check_length, collect


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The body of a plain ASGI request of at most ``limit`` bytes."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            check_length(value.decode("latin-1"), limit)
    return await collect(_chunks(receive), limit)


async def request_body(request: Request, limit: int) -> bytes:
    """The body of a Starlette request of at most ``limit`` bytes."""
    check_length(request.headers.get("content-length", ""), limit)
    try:
        return await collect(request.stream(), limit)
    except ClientDisconnect as exc:
        raise Disconnected from exc


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Disconnected
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return
