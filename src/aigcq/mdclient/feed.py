"""The queue backend's end of the capacity feed (seed 000 §7, :mod:`aigcq.dispatcher.capacity`).

Connects with the current JWT, sends CONNECT, waits for CONNECT_ACK, then hands every
CAPACITY_UPDATE summary to ``on_update``. HEARTBEAT every ``heartbeat_s``; no HEARTBEAT_ACK
within ``timeout_s`` drops the connection. Reconnects with back-off 1, 2, 4 … 32 s (with
jitter); ``connected`` tells the owner whether to trust the feed or poll instead, and
``on_lost`` runs when an established connection drops.

``TASK_DEGRADE {tasks: [{taskId, ...}]}`` (aigcq's addition, seed 000 §9.4.1): the
dispatcher handed these tasks back; ``on_degrade`` takes them back and the client answers
``TASK_DEGRADE_ACK {accepted: [taskId …]}``. Each client has its own ``clientId`` (kept
across reconnects), by which the dispatcher knows whose tasks it holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from aigcq.mdclient.feed_messages import DEGRADE, DEGRADE_ACK, FEED_PATH, message
from aigcq.plumbing.background import backoff_delay, round_failed

log = logging.getLogger(__name__)

CLIENT_ID = "task-queue-backend"


class FeedDown(Exception):
    """The dispatcher did not acknowledge CONNECT or a HEARTBEAT in time."""


def feed_url(base_url: str) -> str:
    """``http(s)://host:port`` → ``ws(s)://host:port/ws/capacity``."""
    base = base_url.rstrip("/")
    return "ws" + base.removeprefix("http") + FEED_PATH if base.startswith("http") else base


class CapacityFeedClient:
    def __init__(
        self,
        base_url: str,
        token: Callable[[], str | None],
        on_update: Callable[[dict[str, Any]], Awaitable[None]],
        *,
        on_degrade: Callable[[list[str]], Awaitable[list[str]]] | None = None,
        on_lost: Callable[[], Awaitable[None]] | None = None,
        heartbeat_s: float = 30.0,
        timeout_s: float = 10.0,
        max_backoff_s: float = 32.0,
    ) -> None:
        self.url = feed_url(base_url)
        self.token = token
        self.on_update = on_update
        self.on_degrade = on_degrade
        self.on_lost = on_lost
        self.client_id = f"{CLIENT_ID}-{uuid.uuid4().hex[:12]}"
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.connected = False
        self._ws: ClientConnection | None = None

    async def run(self) -> None:
        """Stay connected until cancelled."""
        attempt = 0
        while True:
            token = self.token()
            if token is not None:
                try:
                    await self._session(token)
                except (OSError, WebSocketException, TimeoutError, FeedDown) as exc:
                    log.log(
                        logging.WARNING if self.connected else logging.INFO,
                        "capacity feed down: %r",
                        exc,
                    )
                lost = self.connected
                attempt = 0 if lost else attempt
                self.connected, self._ws = False, None
                if lost and self.on_lost is not None:
                    await self.on_lost()
            delay = backoff_delay(attempt, self.max_backoff_s)
            attempt += 1
            await asyncio.sleep(delay)

    async def allocate(self, task_ids: list[str]) -> None:
        """TASK_ALLOCATION for tasks the dispatcher accepted; dropped while disconnected."""
        ws = self._ws
        if ws is None or not task_ids:
            return
        tasks = [{"taskId": t, "targetInstance": None} for t in task_ids]
        try:
            await ws.send(message("TASK_ALLOCATION", allocatedTasks=tasks))
        except WebSocketException as exc:
            log.info("capacity feed: TASK_ALLOCATION not sent: %r", exc)

    async def _session(self, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with connect(
            self.url, additional_headers=headers, open_timeout=self.timeout_s, ping_interval=None
        ) as ws:
            await ws.send(message("CONNECT", clientId=self.client_id))
            ack = _parse(await asyncio.wait_for(ws.recv(), self.timeout_s))
            if ack.get("type") != "CONNECT_ACK":
                raise FeedDown(f"expected CONNECT_ACK, got {str(ack)[:200]}")
            self._ws, self.connected = ws, True
            log.info("capacity feed connected to %s", self.url)
            await self._listen(ws)

    async def _listen(self, ws: ClientConnection) -> None:
        """Read messages and keep the heartbeat going, until the connection fails."""
        next_beat = time.monotonic() + self.heartbeat_s
        ack_due: float | None = None
        while True:
            now = time.monotonic()
            if ack_due is not None and now >= ack_due:
                raise FeedDown("no HEARTBEAT_ACK")
            if now >= next_beat:
                await ws.send(message("HEARTBEAT"))
                ack_due, next_beat = now + self.timeout_s, now + self.heartbeat_s
            wait = min(next_beat, ack_due or next_beat) - now
            try:
                msg = _parse(await asyncio.wait_for(ws.recv(), wait))
            except TimeoutError:
                continue
            if msg.get("type") == "HEARTBEAT_ACK":
                ack_due = None
            else:
                reply = await self._on_message(msg)
                if reply is not None:
                    await ws.send(reply)

    async def _on_message(self, msg: dict[str, Any]) -> str | None:
        """Handle one message; the answer to send, if any."""
        kind, data = msg.get("type"), msg.get("data")
        if kind == "CAPACITY_UPDATE" and isinstance(data, dict):
            summary = data.get("summary")
            if isinstance(summary, dict):
                await self.on_update(summary)
        elif kind == DEGRADE and isinstance(data, dict):
            tasks = data.get("tasks")
            ids = [
                str(t["taskId"])
                for t in (tasks if isinstance(tasks, list) else [])
                if isinstance(t, dict) and isinstance(t.get("taskId"), str)
            ]
            log.warning("capacity feed: the dispatcher hands back %d tasks", len(ids))
            accepted: list[str] = []
            try:
                accepted = await self.on_degrade(ids) if self.on_degrade else []
            except Exception as exc:
                round_failed(log, "capacity feed: taking back handed-back tasks failed", exc)
            return message(DEGRADE_ACK, accepted=accepted)
        elif kind == "ERROR":
            log.warning("capacity feed: dispatcher error %s", data)
        else:
            log.debug("capacity feed: %s %s", kind, data)
        return None


def _parse(frame: str | bytes) -> dict[str, Any]:
    try:
        msg = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return {}
    return msg if isinstance(msg, dict) else {}
