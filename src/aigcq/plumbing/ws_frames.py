"""Server-side WebSocket plumbing: reading frames whichever kind the peer sends (text, or
bytes holding UTF-8 JSON), and closing a socket without waiting on a peer that stopped
reading."""

from __future__ import annotations

import asyncio
import logging

from starlette.websockets import WebSocket

log = logging.getLogger(__name__)


async def receive_frame(ws: WebSocket) -> str | bytes | None:
    """The next frame's text (or bytes); ``None`` once the socket is closed."""
    msg = await ws.receive()
    if msg["type"] == "websocket.disconnect":
        return None
    text: str | None = msg.get("text")
    return text if text is not None else bytes(msg.get("bytes") or b"")


async def send_within(ws: WebSocket, data: str, timeout_s: float) -> None:
    """Send a text frame; a peer that does not take it within ``timeout_s`` (it stopped
    reading, or vanished) is dropped, and ``TimeoutError`` raised."""
    try:
        async with asyncio.timeout(timeout_s):
            await ws.send_text(data)
    except TimeoutError:
        abort(ws)
        raise


async def close_within(ws: WebSocket, code: int, reason: str, timeout_s: float) -> None:
    """Close ``ws`` with a closing handshake if the peer takes part within ``timeout_s``,
    else drop the connection (a peer that stopped reading would hold the close for the
    server's whole close timeout, twice). Never raises."""
    try:
        async with asyncio.timeout(timeout_s):
            await ws.close(code, reason)
    except TimeoutError:
        abort(ws)
    except Exception as exc:  # already closed, or closing: nothing left to do
        log.debug("close of a WebSocket failed: %r", exc)


def abort(ws: WebSocket) -> bool:
    """Drop the connection under ``ws`` at once, with no closing handshake: every send
    waiting on it fails. Uvicorn's ASGI ``receive`` is a method of its protocol object,
    which holds the transport; False where that is not so (another server)."""
    protocol = getattr(ws._receive, "__self__", None)
    drop = getattr(getattr(protocol, "transport", None), "abort", None)  # asyncio or uvloop
    if not callable(drop):
        return False
    drop()
    return True
