"""One bridge WebSocket on the hub side: its send lock, flood limit and close codes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fastapi import WebSocket

from aigcq.bridges.registry import BridgeConn
from aigcq.observability.jsonlog import ctx
from aigcq.wire.bridge import (
    CLOSE_AUTH,
    CLOSE_FLOOD,
    CLOSE_REGISTER_TIMEOUT,
    CLOSE_TIMEOUT,
    BridgeMessage,
    ErrorData,
    ErrorMessage,
    encode,
)

__all__ = [
    "CLOSE_AUTH",
    "CLOSE_FLOOD",
    "CLOSE_REGISTER_TIMEOUT",
    "CLOSE_TIMEOUT",
    "HubConfig",
    "Rate",
    "Session",
]


@dataclass(frozen=True, slots=True)
class HubConfig:
    ping_interval_s: float = 30.0
    heartbeat_interval_s: float = 30.0
    missed_heartbeats: int = 3
    ack_timeout_s: float = 5.0


class Rate:
    """At most ``limit`` messages per one-second window (``0``: no limit)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.window = 0
        self.count = 0

    def allow(self) -> bool:
        now = int(time.monotonic())
        if now != self.window:
            self.window, self.count = now, 0
        self.count += 1
        return self.limit <= 0 or self.count <= self.limit


@dataclass(slots=True)
class Session:
    """One WebSocket: authenticated yet?, the bridge registered on it, its PING loop."""

    ws: WebSocket
    authed: bool
    rate: Rate
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: BridgeConn | None = None
    keepalive: asyncio.Task[None] | None = None

    async def send(self, text: str) -> None:
        async with self.lock:
            await self.ws.send_text(text)

    async def send_message(self, msg: BridgeMessage) -> None:
        await self.send(encode(msg))

    async def error(self, code: str, msg: str) -> None:
        await self.send_message(ErrorMessage(data=ErrorData(code=code, msg=msg)))

    @property
    def bridge_id(self) -> str:
        return self.conn.bridge_id if self.conn else "-"

    def ctx(self) -> dict[str, str]:
        return ctx(bridge=self.conn.bridge_id if self.conn else None)
