"""Reading an HTTP request body with a size limit, on every HTTP surface of every process
(the server's ASGI apps through :mod:`aigcq.plumbing.asgi_body`, the bridge's own server
through :mod:`aigcq.agent.http_server`).

A body is read only after the request is authenticated (where the credential is outside
the body), and never whole before its size is known: a ``Content-Length`` over the limit
is refused before any byte is read, and a chunked body as soon as the bytes seen so far
pass the limit, so the answer (413) leaves while the sender is still sending and at most
``limit`` bytes are ever held.
"""

from __future__ import annotations

from collections.abc import AsyncIterator


class BodyTooLarge(Exception):
    """The body is over the limit (answer 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body over {limit} bytes")
        self.limit = limit


class Disconnected(Exception):
    """The sender went away before its body arrived: nothing to answer."""


def check_length(declared: str, limit: int) -> None:
    """Raise :class:`BodyTooLarge` if a ``Content-Length`` of ``declared`` is over ``limit``."""
    if declared.isascii() and declared.isdigit() and len(declared) < 20 and int(declared) > limit:
        raise BodyTooLarge(limit)


async def collect(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The chunks joined, :class:`BodyTooLarge` as soon as they pass ``limit``."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        parts.append(chunk)
    return b"".join(parts)
