"""Reading WebSocket frames whichever kind the peer sends: text, or bytes (UTF-8 JSON)."""

from __future__ import annotations

from starlette.websockets import WebSocket


async def receive_frame(ws: WebSocket) -> str | bytes | None:
    """The next frame's text (or bytes); ``None`` once the socket is closed."""
    msg = await ws.receive()
    if msg["type"] == "websocket.disconnect":
        return None
    text: str | None = msg.get("text")
    return text if text is not None else bytes(msg.get("bytes") or b"")
